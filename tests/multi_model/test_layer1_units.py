"""Units of layer 1 on real answers: tie-aware calibration, profile merging, logprob extraction."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from tokenops.gateway.core.confidence import request_logprobs, strip_logprobs, token_logprobs
from tokenops.gateway.core.profile_source import ProfileSource, merge_profiles
from tokenops.types import GatewayRequest, GatewayResponse
from tokenops_plugins.multi_model._calibration import calibrate_share, strong_share
from tokenops_plugins.multi_model._profiles import save_profile


def test_calibration_reports_the_share_it_really_sends():
    scores = [i / 100 for i in range(100)]
    threshold, share = calibrate_share(scores, 0.3)
    assert share == 0.3 and strong_share(scores, threshold) == 0.3
    tied = [0.42] * 50
    threshold, share = calibrate_share(tied, 0.3)
    assert share in (0.0, 1.0)  # every score tied: no threshold sends 30%
    with pytest.raises(ValueError, match="no recorded"):
        calibrate_share([], 0.3)


def test_route_calibrate_cli_does_not_claim_an_impossible_share(tmp_path):
    from tokenops.cli import build_app
    from tokenops.store import Store
    from typer.testing import CliRunner

    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        w = store.writer()
        w.write_many(
            "requests",
            [
                {
                    "id": f"r{i}",
                    "ts": float(i),
                    "status": "ok",
                    "decisions": json.dumps({"route": {"router": "threshold", "score": 0.5}}),
                }
                for i in range(10)
            ],
        )
        w.close()
    out = tmp_path / "threshold.toml"
    r = CliRunner().invoke(
        build_app(), ["route", "calibrate", "--strong-share", "0.3", "--store", str(db), "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert "sends 30%" not in r.output and "asked for 30%" in r.output, r.output


def test_store_rows_newer_than_the_file_win(tmp_path):
    save_profile(
        {
            "model": "m",
            "updated_at": "2026-01-01T00:00:00+00:00",
            "dimensions": {
                "math": {"score": 0.1, "ci_low": 0.0, "ci_high": 0.3, "n": 10},
                "code": {"score": 0.5, "ci_low": 0.3, "ci_high": 0.7, "n": 10},
            },
        },
        tmp_path,
    )
    src = ProfileSource(tmp_path)
    files = src.load()
    rows = [
        ("m", "math", 0.9, 0.8, 0.95, 40, datetime(2026, 2, 1)),
        ("m", "code", 0.0, 0.0, 0.1, 5, datetime(2025, 1, 1)),
        ("other", "math", 0.7, 0.6, 0.8, 20, datetime(2026, 2, 1)),
    ]
    merged = merge_profiles(files, rows)
    assert merged["m"]["dimensions"]["math"]["score"] == 0.9  # newer store row
    assert merged["m"]["dimensions"]["code"]["score"] == 0.5  # older store row loses to the file
    assert merged["other"]["dimensions"]["math"]["n"] == 20
    assert not src.changed()
    save_profile(
        {"model": "new", "dimensions": {"math": {"score": 1.0, "ci_low": 0.9, "ci_high": 1.0, "n": 3}}}, tmp_path
    )
    assert src.changed() and "new" in src.load()


def test_logprobs_asked_for_the_validator_are_stripped_after():
    req = GatewayRequest(kind="chat", model="cascade", body={}, messages=[{"role": "user", "content": "hi"}])
    assert request_logprobs(req) and req.body["logprobs"] is True
    lp = {"content": [{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -0.3}]}
    assert token_logprobs(lp) == [-0.1, -0.3]
    assert token_logprobs({"tokens": ["a"], "token_logprobs": [-0.5]}) == [-0.5]
    resp = GatewayResponse(text="ab", model="small", extra={"choices": [{"index": 0, "text": "ab", "logprobs": lp}]})
    strip_logprobs(req, resp)
    assert resp.extra["choices"][0]["logprobs"] is None and "logprobs" not in req.body
    asked = GatewayRequest(kind="chat", model="cascade", body={"logprobs": True}, messages=[])
    assert not request_logprobs(asked)  # the client asked: keep them


def test_shipped_weights_stay_light_and_the_ladder_shares_the_demo_tokenizer():
    from pathlib import Path

    demo = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models"
    total = sum(f.stat().st_size for f in demo.rglob("*") if f.is_file())
    assert total < 64 * 2**20, f"shipped demo models take {total / 2**20:.1f} MiB (limit 64 MiB)"
    for name in ("ladder-small", "ladder-large"):
        if not (demo / name / "config.json").is_file():
            pytest.skip("the ladder weights are not in this checkout")
        config = json.loads((demo / name / "config.json").read_text())
        assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
        assert (demo / name / "tokenizer.json").read_bytes() == (demo / "target" / "tokenizer.json").read_bytes()
        assert (demo / name / "tokenizer_config.json").read_bytes() == (
            demo / "target" / "tokenizer_config.json"
        ).read_bytes()


def test_plain_serve_serves_the_ladder_with_its_prices():
    from tokenops.backends.registry import LADDER_PRICES, default_model_configs

    models = {m.name: m for m in default_model_configs()}
    for name, (cost_in, cost_out) in LADDER_PRICES.items():
        if name not in models:
            pytest.skip("the ladder weights are not in this checkout")
        assert (models[name].cost_input_per_1m, models[name].cost_output_per_1m) == (cost_in, cost_out)
        assert models[name].path.endswith(name.removeprefix("tokenops-"))


def test_plain_serve_profile_router_uses_the_shipped_ladder_profiles_and_prices():
    """`make serve` with only the README's [plugins.router] use = "profile": no [[models]], so
    prices come from the default models and profiles from profiles/models/."""
    from pathlib import Path

    from tokenops.config import Settings
    from tokenops_plugins.multi_model import _router_config as rc
    from tokenops_plugins.multi_model._profiles import load_profiles
    from tokenops_plugins.multi_model._router_config import RouterConfig
    from tokenops_plugins.multi_model._suites import make_suite
    from tokenops_plugins.multi_model.profile_router import choose

    profiles = load_profiles(Path(__file__).resolve().parents[2] / "profiles" / "models")
    ladder = ["tokenops-ladder-large", "tokenops-ladder-small"]
    if not set(ladder) <= set(profiles):
        pytest.skip("the ladder profiles are not in this checkout")
    config = RouterConfig(Settings())
    rc._state["defaults"] = None
    try:
        assert config.by_cost(ladder) == ["tokenops-ladder-small", "tokenops-ladder-large"]
        pick = lambda d: choose(make_suite(d, 1, seed=42)[0].prompt, ladder, profiles, 0.9, config=config).model  # noqa: E731
        assert pick("classification") == "tokenops-ladder-small"  # both 1.00: the cheaper one
        assert pick("extraction") == "tokenops-ladder-large"  # small 0.03, large 1.00
    finally:
        rc._state["defaults"] = None
