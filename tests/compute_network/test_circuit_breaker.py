"""Circuit breaker state machine, outlier ejection and the plugin's hooks."""

import pytest

from tokenops.resilience.breaker import CLOSED, HALF_OPEN, OPEN, BreakerConfig, CircuitBreaker
from tokenops.resilience.health import HealthProber, ReplicaHealth
from tokenops.resilience.outlier import OutlierConfig
from tokenops.types import BackendError, BackendOutcome, RouteDecision

from .helpers import FakeReplica, chat, replicas

OK = BackendOutcome(True, 0.1, None, 10, 10)
FAIL = BackendOutcome(False, 0.1, "unavailable")


def test_trips_on_failure_rate_and_recovers_through_half_open(clock):
    b = CircuitBreaker(BreakerConfig(window_s=10, min_calls=4, failure_rate=0.5, consecutive_failures=100,
                                     cooldown_s=5, num_trial_calls=2), clock)
    for ok in (True, False, True):
        b.record(ok)
    assert b.current_state() == CLOSED
    b.record(False)  # 2 of 4 failed
    assert b.current_state() == OPEN and not b.can_call()
    clock.advance(4.9)
    assert b.current_state() == OPEN
    clock.advance(0.2)
    assert b.current_state() == HALF_OPEN and b.can_call()
    b.on_call()
    b.on_call()
    assert not b.can_call()  # only two trial calls at a time
    b.record(True)
    assert b.current_state() == HALF_OPEN
    b.record(True)
    assert b.current_state() == CLOSED and b.can_call()


def test_failed_trial_reopens_with_longer_cooldown(clock):
    b = CircuitBreaker(BreakerConfig(consecutive_failures=2, cooldown_s=5, max_cooldown_s=12), clock)
    b.record(False)
    b.record(False)
    assert b.current_state() == OPEN
    clock.advance(5)
    assert b.current_state() == HALF_OPEN
    b.record(False)
    assert b.current_state() == OPEN
    clock.advance(9)
    assert b.current_state() == OPEN  # cooldown doubled to 10
    clock.advance(1)
    b.record(False)
    clock.advance(12)  # capped at max_cooldown_s
    assert b.current_state() == HALF_OPEN


def test_old_failures_leave_the_window(clock):
    b = CircuitBreaker(BreakerConfig(window_s=10, min_calls=2, failure_rate=0.5, consecutive_failures=5), clock)
    b.record(False)
    clock.advance(11)
    b.record(True)
    b.record(True)
    b.record(False)
    assert b.current_state() == CLOSED  # 1 of 3 in the window


def test_client_errors_do_not_count(clock):
    h = ReplicaHealth(BreakerConfig(consecutive_failures=2), clock=clock)
    for _ in range(5):
        h.record("r", BackendOutcome(False, 0.1, "context_length"))
    assert h.is_available("r")
    h.record("r", FAIL)
    h.record("r", FAIL)
    assert not h.is_available("r")


def test_outlier_ejection_and_return(clock):
    h = ReplicaHealth(BreakerConfig(), OutlierConfig(factor=3, min_samples=5, ejection_s=30), clock=clock)
    for _ in range(10):
        for name, latency in (("a", 0.1), ("b", 0.12), ("c", 0.11), ("slow", 1.0)):
            h.record(name, BackendOutcome(True, latency, None, 10, 9))
    assert not h.is_available("slow") and h.is_available("a")
    assert h.states().get("slow") == "ejected"
    clock.advance(31)
    assert h.is_available("slow")


def test_outlier_ejection_is_capped():
    from .helpers import FakeClock

    clock = FakeClock()
    h = ReplicaHealth(BreakerConfig(), OutlierConfig(factor=1.5, min_samples=3, max_ejected_fraction=0.5), clock=clock)
    for _ in range(10):
        for name, latency in (("a", 0.1), ("b", 1.0), ("c", 2.0), ("d", 4.0)):
            h.record(name, BackendOutcome(True, latency, None, 0, 0))
    assert sum(not h.is_available(n) for n in "abcd") <= 2


@pytest.fixture
def breaker_plugin(clock):
    from tokenops.plugin_manager import get_plugin_manager

    circuit_breaker = get_plugin_manager().get_plugin("circuit_breaker")  # the process-wide instance (no gateway)
    circuit_breaker.configure(BreakerConfig(consecutive_failures=2, cooldown_s=5), degrade={"big": "small"},
                              clock=clock)
    try:
        yield circuit_breaker
    finally:
        circuit_breaker.disable()


def test_selection_skips_open_replicas_and_restores_the_list(breaker_plugin):
    from tokenops.plugin_manager import hook

    reps = replicas(3)
    for _ in range(2):
        hook().tokenops_backend_outcome(backend="m#1", outcome=FAIL)
    given = list(reps)
    chosen = {hook().tokenops_select_replica(request=chat(f"q{i}"), replicas=given).name for i in range(12)}
    assert chosen == {"m#0", "m#2"}
    assert given == reps  # the gateway's list is left as it was
    r = chat("q")
    hook().tokenops_select_replica(request=r, replicas=given)
    assert r.decisions["breaker"] == {"excluded": ["m#1"]}


def test_all_open_passes_and_degrades(breaker_plugin):
    from tokenops.plugin_manager import hook

    big = [FakeReplica("big#0", model="big"), FakeReplica("big#1", model="big")]
    hook().tokenops_select_replica(request=chat("q"), replicas=list(big))
    for name in ("big#0", "big#1"):
        for _ in range(2):
            hook().tokenops_backend_outcome(backend=name, outcome=FAIL)
    assert hook().tokenops_select_replica(request=chat("q"), replicas=list(big)) is None
    r = chat("q")
    # route wrapper: the routed model is replaced while its replicas are open
    gen = breaker_plugin.tokenops_route(r, ["big", "small"], {})
    next(gen)
    with pytest.raises(StopIteration) as stop:
        gen.send(RouteDecision("big", "rules"))
    assert stop.value.value.model == "small" and stop.value.value.reason == "degraded:replicas_open"
    # fallback after a failed call names the smaller model once
    r.attempts.append("big")
    assert hook().tokenops_fallback(request=r, error=BackendError("down", kind="unavailable")) == "small"
    r.attempts.append("small")
    assert breaker_plugin.tokenops_fallback(r, BackendError("down", kind="unavailable")) is None
    assert breaker_plugin.tokenops_fallback(chat("q"), BackendError("too long", kind="context_length")) is None


def test_health_probe_opens_breaker(clock):
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    status = {"code": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status["code"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        h = ReplicaHealth(BreakerConfig(), clock=clock)
        prober = HealthProber(h, interval_s=3600)

        class Backend:
            url = f"http://127.0.0.1:{server.server_port}/v1"

        prober.watch([FakeReplica("up#0", backend=Backend()), FakeReplica("local#0", backend=object())])
        assert list(prober.targets) == ["up#0"]
        assert prober.probe_once() == {"up#0": True} and h.is_available("up#0")
        status["code"] = 503
        assert prober.probe_once() == {"up#0": False} and not h.is_available("up#0")
        prober.stop()
    finally:
        server.shutdown()


def test_overloaded_model_degrades(clock):
    from tokenops_plugins.compute_network.circuit_breaker import BreakerPlugin

    circuit_breaker = BreakerPlugin()  # an instance of its own
    circuit_breaker.configure(BreakerConfig(), degrade={"big": "small"}, max_in_flight=2, clock=clock)
    try:
        big = [FakeReplica("big#0", model="big"), FakeReplica("big#1", model="big")]
        circuit_breaker.health.available(big)
        for r in big:
            r.in_flight = 2
        gen = circuit_breaker.tokenops_route(chat("q"), ["big", "small"], {})
        next(gen)
        with pytest.raises(StopIteration) as stop:
            gen.send(RouteDecision("big", "rules"))
        assert stop.value.value.model == "small" and stop.value.value.reason == "degraded:overloaded"
        big[0].in_flight = 1  # one replica has room again: no degradation
        gen = circuit_breaker.tokenops_route(chat("q"), ["big", "small"], {})
        next(gen)
        with pytest.raises(StopIteration) as stop:
            gen.send(RouteDecision("big", "rules"))
        assert stop.value.value.model == "big"
    finally:
        circuit_breaker.disable()
