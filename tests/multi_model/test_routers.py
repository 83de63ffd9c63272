import pytest

from tokenops.config import ModelConfig, Settings
from tokenops.types import GatewayRequest
from tokenops_plugins.multi_model import profile_router, threshold_router
from tokenops_plugins.multi_model.profile_router import ProfileRouter
from tokenops_plugins.multi_model.rules_router import RulesRouter
from tokenops_plugins.multi_model.threshold_router import ThresholdRouter
from tokenops_plugins.multi_model._suites import DIMENSIONS, make_mixed, make_suite
from tokenops_plugins.multi_model._text_model import Logistic


def request(text, model="auto", tenant="default"):
    return GatewayRequest(kind="chat", model=model, body={}, messages=[{"role": "user", "content": text}], tenant=tenant)


#: One instance of each router, as a gateway holds them (configured per test by ``configure``).
rules_router, router_by_profile, router_by_threshold = RulesRouter(), ProfileRouter(), ThresholdRouter()


def configure(router_conf, models=("small", "big")):
    settings = Settings(models=[ModelConfig("small", cost_output_per_1m=0.6), ModelConfig("big", cost_output_per_1m=10.0)])
    settings.plugins["router"] = router_conf
    for plugin in (rules_router, router_by_profile, router_by_threshold):
        plugin.tokenops_configure(settings)
    return settings


@pytest.fixture(autouse=True)
def reset_router():
    yield
    for plugin in (rules_router, router_by_profile, router_by_threshold):
        plugin.tokenops_configure(Settings())
    router_by_threshold.live_threshold = None


def test_rules_router_first_matching_rule_wins():
    configure({"use": "rules", "default": "small", "rules": {"rules": [
        {"regex": r"(?i)\bprove\b", "model": "big"},
        {"tenant": "premium", "model": "big"},
        {"keywords": ["JSON"], "max_chars": 50, "model": "small"},
    ]}})
    cands = ["small", "big"]
    d = rules_router.tokenops_route(request("Please PROVE this"), cands, {})
    assert d.model == "big" and "rule #1" in d.reason
    assert rules_router.tokenops_route(request("hello", tenant="premium"), cands, {}).model == "big"
    assert rules_router.tokenops_route(request("give json"), cands, {}).reason.startswith("rules: rule #3")
    d = rules_router.tokenops_route(request("give json " + "x" * 100), cands, {})
    assert d.model == "small" and "default" in d.reason
    # Not the alias: the router stays out of it.
    assert rules_router.tokenops_route(request("prove", model="big"), cands, {}) is None


def test_rules_router_rejects_rule_without_model():
    with pytest.raises(ValueError, match="no model"):
        configure({"use": "rules", "rules": {"rules": [{"regex": "x"}]}})


def test_inactive_router_passes():
    configure({"use": "profile"})
    assert rules_router.tokenops_route(request("anything"), ["small", "big"], {}) is None


def test_dimension_classifier_generalises_to_unseen_seeds():
    clf = profile_router.dimension_classifier()
    tasks = make_mixed(15, seed=99)
    accuracy = sum(clf.predict(t.prompt) == t.dimension for t in tasks) / len(tasks)
    assert accuracy >= 0.95


def profile(scores):
    return {"dimensions": {d: {"score": s, "ci_low": s - 0.05, "ci_high": min(1, s + 0.05), "n": 100} for d, s in scores.items()}}


def test_profile_router_picks_cheapest_model_that_clears_threshold():
    from tokenops_plugins.multi_model import profile_telemetry

    profile_telemetry.reset()  # running error rates recorded by earlier in-process gateway tests steer the router
    configure({"use": "profile", "profile": {"threshold": 0.9}})
    profiles = {"small": profile({"math": 0.5, "classification": 0.95}), "big": profile({"math": 0.96, "classification": 0.97})}
    math_prompt = make_suite("math", 1, seed=5)[0].prompt
    cls_prompt = make_suite("classification", 1, seed=5)[0].prompt
    d = router_by_profile.tokenops_route(request(math_prompt), ["small", "big"], profiles)
    assert d.model == "big" and d.reason.startswith("profile: math")
    d = router_by_profile.tokenops_route(request(cls_prompt), ["small", "big"], profiles)
    assert d.model == "small" and "classification" in d.reason
    # With the Wilson lower bound the small model no longer clears 0.93.
    configure({"use": "profile", "profile": {"threshold": 0.93, "lower_bound": True}})
    assert router_by_profile.tokenops_route(request(cls_prompt), ["small", "big"], profiles).model == "big"


def test_profile_router_without_profiles_uses_default():
    configure({"use": "profile", "default": "small"})
    d = router_by_profile.tokenops_route(request("2+2?"), ["small", "big"], {})
    assert d.model == "small" and "no profiles" in d.reason


def test_threshold_router_predictor_and_live_threshold(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tasks = make_mixed(20, seed=1)
    hard = {"math", "code"}
    Logistic().fit([t.prompt for t in tasks], [float(t.dimension in hard) for t in tasks]).save(tmp_path / "p.json")
    configure({"use": "threshold", "threshold": {"strong": "big", "weak": "small", "predictor": str(tmp_path / "p.json"), "threshold": 0.5}})
    cands = ["small", "big"]
    hard_prompt = make_suite("code", 1, seed=7)[0].prompt
    easy_prompt = make_suite("extraction", 1, seed=7)[0].prompt
    d = router_by_threshold.tokenops_route(request(hard_prompt), cands, {})
    assert d.model == "big" and d.score > 0.5 and d.router == "threshold"
    assert router_by_threshold.tokenops_route(request(easy_prompt), cands, {}).model == "small"
    router_by_threshold.tokenops_apply_tunables({"router.threshold": 0.999})
    assert router_by_threshold.tokenops_route(request(hard_prompt), cands, {}).model == "small"


def test_calibrate_hits_requested_share():
    scores = [i / 100 for i in range(100)]
    t = threshold_router.calibrate(scores, 0.3)
    assert sum(s >= t for s in scores) == 30
    with pytest.raises(ValueError, match="no recorded"):
        threshold_router.calibrate([], 0.3)


@pytest.mark.parametrize("dimension", DIMENSIONS)
def test_suite_checkers_accept_reference_and_reject_wrong(dimension):
    for task in make_suite(dimension, 5, seed=3):
        assert task.check(task.reference), task
        assert not task.check("I am not sure, maybe 0"), task


def test_running_error_rate_steers_profile_router_away():
    from tokenops.plugin_manager import get_plugin
    from tokenops.types import TelemetryEvent

    profile_telemetry = get_plugin("profile_telemetry")  # the process's instance: what the router reads here

    configure({"use": "profile", "profile": {"threshold": 0.9, "max_error_rate": 0.2}})
    profiles = {"small": profile({"classification": 0.95}), "big": profile({"classification": 0.97})}
    prompt = make_suite("classification", 1, seed=5)[0].prompt
    profile_telemetry.reset()
    try:
        assert router_by_profile.tokenops_route(request(prompt), ["small", "big"], profiles).model == "small"
        for _ in range(10):
            profile_telemetry.tokenops_record(TelemetryEvent("requests", {"model_served": "small", "status": "error", "e2e_s": 1.0,
                                                                          "decisions": '{"validate": 0.1}'}))
        stats = profile_telemetry.running_stats("small")
        assert stats["error_rate"] > 0.8 and stats["validator_pass_rate"] < 0.2
        assert router_by_profile.tokenops_route(request(prompt), ["small", "big"], profiles).model == "big"
    finally:
        profile_telemetry.reset()


def test_route_calibrate_cli_reads_recorded_scores(tmp_path):
    import json

    from typer.testing import CliRunner

    from tokenops.cli import build_app
    from tokenops.store import Store

    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        w = store.writer()
        w.write_many("requests", [{"id": f"r{i}", "ts": float(i), "status": "ok",
                                   "decisions": json.dumps({"route": {"router": "threshold", "score": i / 10}})} for i in range(10)])
        w.close()
    out = tmp_path / "threshold.toml"
    r = CliRunner().invoke(build_app(), ["route", "calibrate", "--strong-share", "0.3", "--store", str(db), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["samples"] == 10 and data["threshold"] == 0.7  # scores 0.7, 0.8, 0.9 go strong
    assert "threshold = 0.7" in out.read_text()
