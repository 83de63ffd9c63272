"""Rate bracketing on a synthetic capacity model finds the knee with few measurements."""

import math

import pytest

from tokenops.bench.metrics import BenchSummary
from tokenops.slo import parse_slo
from tokenops.tune.goodput import BracketConfig, find_goodput

SLO = parse_slo("p95=200ms")


def summary_for(value_s: float) -> BenchSummary:
    """A run whose TTFT p95 is ``value_s`` (inf when the server fell over)."""
    met = value_s <= SLO.threshold_s
    row = {"label": SLO.label, "metric": "ttft", "percentile": 95.0, "threshold_s": SLO.threshold_s,
           "value_s": None if math.isinf(value_s) else value_s, "met": met}
    lat = {m: {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None} for m in ("ttft", "tpot", "itl", "e2e")}
    return BenchSummary(10, 10, 0, {}, 1.0, 1.0, 0, 0, 0, 0, lat, [row], 1.0 if met else 0.0, 1.0, met)


class Queue:
    """M/M/1-like: p95 latency = base / (1 - rate / capacity); the SLO knee is exact."""

    def __init__(self, capacity: float, base: float = 0.05):
        self.capacity, self.base, self.calls = capacity, base, []

    def __call__(self, rate: float, repeat: int = 0) -> BenchSummary:
        self.calls.append(rate)
        if rate >= self.capacity:
            return summary_for(math.inf)
        return summary_for(self.base / (1 - rate / self.capacity))

    @property
    def knee(self) -> float:  # base / (1 - r/c) = 0.2  ->  r = c * (1 - base / 0.2)
        return self.capacity * (1 - self.base / SLO.threshold_s)


@pytest.mark.parametrize("capacity,start", [(10.0, 1.0), (10.0, 50.0), (3.3, 0.2), (250.0, 7.0)])
def test_bracketing_finds_the_knee(capacity, start):
    q = Queue(capacity)
    res = find_goodput(q, start, BracketConfig(max_measurements=8, rel_tol=0.05))
    assert res.status == "complete"
    assert q.knee * 0.9 <= res.goodput <= q.knee + 1e-9  # a passing rate within 10% of the knee
    assert res.estimate == pytest.approx(q.knee, rel=0.15)
    assert len(q.calls) <= 9  # 8 + the confirmation
    assert res.points[-1].repeat == 1 and res.points[-1].rate == res.goodput  # the goodput was confirmed
    assert all(p.is_met == (p.rate <= q.knee + 1e-9) for p in res.points)


def test_interpolation_beats_bisection():
    q = Queue(10.0)
    res = find_goodput(q, 1.0, BracketConfig(max_measurements=6, rel_tol=0.01))
    # doubling 1, 2, 4, 8 (fails) then regula falsi lands close to 7.5 within two more measurements
    assert res.goodput >= 0.97 * q.knee


def test_hopeless_trial_stops_at_the_incumbent():
    q = Queue(5.0)  # knee 3.75
    res = find_goodput(q, 1.0, incumbent=6.0)
    assert res.status == "pruned" and len(q.calls) == 1 and q.calls[0] == 6.0
    assert res.objective < 6.0


def test_better_trial_climbs_from_the_incumbent():
    q = Queue(20.0)  # knee 15
    res = find_goodput(q, 1.0, BracketConfig(max_measurements=6), incumbent=5.0)
    assert q.calls[0] == 5.0 and res.status == "complete" and res.goodput >= 13.5


def test_infeasible_when_even_the_lowest_rate_misses():
    q = Queue(10.0, base=0.5)  # unloaded latency already above the SLO
    res = find_goodput(q, 1.0, BracketConfig(max_measurements=4))
    assert res.status == "infeasible" and res.goodput == 0.0 and len(q.calls) == 4


def test_a_lucky_pass_is_not_kept():
    """The knee is 7.5, but the first measurement at 10/s passes by luck; its repeat fails."""
    q = Queue(10.0)
    lucky = {10.0}

    def noisy(rate, repeat=0):
        if rate in lucky and repeat == 0:
            return summary_for(0.1)
        return q(rate, repeat)

    res = find_goodput(noisy, 10.0, BracketConfig(max_measurements=7, rel_tol=0.1))
    assert res.status == "complete" and res.goodput <= q.knee
    assert any(p.rate == 10.0 and p.repeat == 1 and not p.is_met for p in res.points)
    assert res.goodput >= 0.5 * q.knee and res.points[-1].repeat == 1 and res.points[-1].is_met


def test_passes_that_fail_their_repeat_are_unconfirmed():
    q = Queue(10.0)

    def flaky(rate, repeat=0):
        return summary_for(0.1 if repeat == 0 else 1.0)  # every first look passes, every repeat fails

    res = find_goodput(flaky, 4.0, BracketConfig(max_measurements=3))
    assert res.status == "unconfirmed" and res.goodput == 4.0 and res.objective == 4.0
    assert any(p.repeat == 1 and not p.is_met for p in res.points)


def test_a_rate_the_server_does_not_keep_up_with_fails():
    def measure(rate, repeat=0):
        s = summary_for(0.05)  # the percentiles pass...
        s.latency["e2e"]["p50"] = 0.5
        s.num_requests, s.offered_rate = 100, rate
        s.duration_s = 99 / min(rate, 6.0) + 0.5  # ...but it never completes more than 6/s
        return s

    res = find_goodput(measure, 2.0, BracketConfig(max_measurements=8, rel_tol=0.05))
    assert res.status == "complete" and 6.0 <= res.goodput <= 7.5
    assert all(p.is_met == (p.rate <= 7.5) for p in res.points)
