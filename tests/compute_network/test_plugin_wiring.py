"""The layer-4 plugins are registered, opt-in, configured from tokenops.toml and
driven by their live tunables."""

import pytest

from tokenops.config import ConfigError, Settings
from tokenops.plugin_manager import get_plugin_manager, get_tunables, hook
from tokenops.types import BackendOutcome, TelemetryEvent

from .helpers import FakeReplica, chat, replicas

MINE = ("load_balance", "rate_limit", "semantic_cache", "circuit_breaker")


def test_plugins_are_registered_with_their_tunables():
    pm = get_plugin_manager()
    for name in MINE:
        assert pm.has_plugin(name), name
    registry = get_tunables()
    policy = registry["routing.replica_policy"]
    assert policy.live and policy.default == "round_robin"
    assert set(policy.choices) == {"round_robin", "least_load", "p2c", "sticky", "prefix_aware", "kv_aware"}
    for name in ("routing.sticky_load_factor", "routing.prefix_load_weight", "ratelimit.mode",
                 "ratelimit.tenant_tokens_per_min", "cache.enabled", "breaker.enabled", "breaker.cooldown_s"):
        assert registry[name].live, name


def test_defaults_change_nothing_but_breakers_on_replica_sets():
    """Unconfigured, the layer-4 plugins pass: round robin, no cache, no limits; breakers
    watch models with two or more replicas only (issue 17: a dead replica costs no errors)."""
    circuit_breaker = get_plugin_manager().get_plugin("circuit_breaker")  # the process-wide instance (no gateway)
    circuit_breaker.disable()
    circuit_breaker.tokenops_configure(Settings())
    try:
        r = chat("hello")
        assert hook().tokenops_admit(request=r) is None
        assert hook().tokenops_cache_lookup(request=r) is None
        reps = replicas(3)
        names = [hook().tokenops_select_replica(request=chat("x"), replicas=reps).name for _ in range(6)]
        assert sorted(set(names)) == ["m#0", "m#1", "m#2"]  # the gateway's round robin still decides
        for _ in range(10):
            hook().tokenops_backend_outcome(backend="m#0", outcome=BackendOutcome(False, 0.1, "unavailable"))
        assert "m#0" not in {hook().tokenops_select_replica(request=chat("x"), replicas=reps).name for _ in range(6)}
        # a model's only replica is never filtered by default (nothing to send its traffic to instead)
        only = FakeReplica("solo#0", index=0)
        for _ in range(10):
            hook().tokenops_backend_outcome(backend=only.name, outcome=BackendOutcome(False, 0.1, "unavailable"))
        assert hook().tokenops_select_replica(request=chat("x"), replicas=[only]) in (None, only)
        assert circuit_breaker.health.states().get(only.name, "closed") == "closed"
    finally:
        circuit_breaker.disable()


@pytest.fixture
def restore():
    from tokenops.ratelimit.config import RateLimitConfig

    yield
    load_balance = get_plugin_manager().get_plugin("load_balance")  # the process-wide instance (no gateway)
    load_balance.apply({"routing.replica_policy": "round_robin"})
    load_balance.selector.tracker.reset()
    get_plugin_manager().get_plugin("rate_limit").configure(RateLimitConfig())
    get_plugin_manager().get_plugin("semantic_cache").disable()
    get_plugin_manager().get_plugin("circuit_breaker").disable()


def test_policy_tunable_switches_selection_live(restore):
    load_balance = get_plugin_manager().get_plugin("load_balance")

    hook().tokenops_apply_tunables(values={"routing.replica_policy": "sticky", "routing.sticky_load_factor": 1.5})
    assert load_balance.selector.config.policy == "sticky" and load_balance.selector.config.sticky_load_factor == 1.5
    reps = replicas(4)
    picks = set()
    for _ in range(5):
        chosen = hook().tokenops_select_replica(request=chat("q", session="abc"), replicas=reps)
        hook().tokenops_backend_outcome(backend=chosen.name, outcome=BackendOutcome(True, 0.1, None, 3, 2))
        picks.add(chosen.name)
    assert len(picks) == 1
    assert load_balance.selector.tracker.outstanding_tokens(picks.pop()) == 0


def test_configure_from_settings(restore):
    load_balance = get_plugin_manager().get_plugin("load_balance")
    circuit_breaker = get_plugin_manager().get_plugin("circuit_breaker")
    settings = Settings(plugins={
        "load_balance": {"policy": "prefix_aware", "prefix_load_weight": 0.25},
        "rate_limit": {"tenant": {"requests_per_min": 60}, "burst_s": 1.0},
        "semantic_cache": {"embedder": "lexical", "ttl_s": 60},
        "circuit_breaker": {"consecutive_failures": 2, "degrade_to": {"big": "small"}, "outlier": True,
                            "outlier_factor": 4.0},
    })
    for name in MINE:
        get_plugin_manager().get_plugin(name).tokenops_configure(settings)
    assert load_balance.selector.config.policy == "prefix_aware"
    limiter = get_plugin_manager().get_plugin("rate_limit").limiter  # the process-wide instance (no gateway)
    assert limiter is not None and limiter.config.burst_s == 1.0
    cache = get_plugin_manager().get_plugin("semantic_cache").cache
    assert cache is not None and cache.config.ttl_s == 60 and cache.embedder.name == "lexical"
    assert circuit_breaker.degrade_to == {"big": "small"} and circuit_breaker.health.outliers.config.factor == 4.0
    with pytest.raises(ConfigError, match="rate_limit"):
        get_plugin_manager().get_plugin("rate_limit").tokenops_configure(
            Settings(plugins={"rate_limit": {"tenant": {"requests_per_min": -1}}}))
    with pytest.raises(ConfigError, match="circuit_breaker"):
        circuit_breaker.tokenops_configure(Settings(plugins={"circuit_breaker": {"bogus": 1}}))


def test_rate_limit_tunable_enables_and_telemetry_corrects(restore):
    hook().tokenops_apply_tunables(values={"ratelimit.tenant_tokens_per_min": 6000, "ratelimit.burst_s": 1.0})
    assert get_plugin_manager().get_plugin("rate_limit").limiter is not None
    r = chat("x" * 40, max_tokens=50)  # estimate 10 + 50 = 60 of a 100-token bucket
    assert hook().tokenops_admit(request=r) is None
    assert r.decisions["rate_limit"] == "admitted"
    assert hook().tokenops_admit(request=chat("x" * 40, max_tokens=50)) is not None
    # the finished request used 12 tokens: 48 come back through the requests telemetry row
    hook().tokenops_record(event=TelemetryEvent("requests", {"id": r.id, "tokens_in": 10, "tokens_out": 2}))
    assert hook().tokenops_admit(request=chat("x" * 40, max_tokens=50)) is None
    hook().tokenops_apply_tunables(values={"ratelimit.tenant_tokens_per_min": 0})
    assert all(hook().tokenops_admit(request=chat("q", max_tokens=500)) is None for _ in range(5))
