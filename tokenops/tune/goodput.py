"""Goodput of one configuration: the highest request rate whose measured
percentiles meet every SLO, found with few short measurements.

The rate is first bracketed (doubling up from a passing rate, halving down from
a failing one), then refined by safeguarded interpolation (regula falsi on the
log of the worst SLO ratio value/threshold, kept inside the bracket's middle
80% so the bracket always shrinks). The final passing rate is then confirmed by
a repeat measurement with other random arrivals: a rate that passed once by
luck would otherwise become an incumbent nothing can beat. A trial whose first
measurement, taken at the incumbent's goodput, already misses the SLO cannot
beat the incumbent and stops there (early stopping of hopeless trials).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenops.bench.metrics import BenchSummary

#: measure(rate, repeat) -> summary; ``repeat`` > 0 asks for fresh random arrivals.
MeasureFn = Callable[[float, int], BenchSummary]


@dataclass(slots=True)
class RatePoint:
    """One measurement: the offered rate and what it gave."""

    rate: float
    is_met: bool
    worst_ratio: float
    summary: BenchSummary | None = None
    repeat: int = 0

    def to_dict(self) -> dict:
        s = self.summary
        d: dict[str, Any] = {
            "rate": self.rate,
            "met": self.is_met,
            "repeat": self.repeat,
            "worst_ratio": None if math.isinf(self.worst_ratio) else self.worst_ratio,
        }
        if s is not None:
            d.update(
                {
                    "achieved_rps": s.request_rate,
                    "errors": s.num_errors,
                    "slo": {r["label"]: r["value_s"] for r in s.slo},
                }
            )
        return d


@dataclass(slots=True)
class GoodputResult:
    """``goodput``: highest measured passing rate (0 when none passed).
    ``status``: complete | pruned (cannot beat the incumbent) | infeasible (no rate passed) |
    unconfirmed (``goodput`` passed once but its repeat failed or was not measured before the
    measurements ran out; such a trial informs the search but cannot win)."""

    goodput: float
    status: str
    points: list[RatePoint] = field(default_factory=list)
    #: Rate where the worst SLO ratio crosses 1 by interpolation in the last bracket (an estimate).
    estimate: float | None = None
    elapsed_s: float = 0.0

    @property
    def objective(self) -> float:
        """What the search maximises: the goodput, or for a pruned trial its best estimate
        (always below the incumbent, so the search learns the region is worse)."""
        if self.status == "pruned" and self.estimate is not None:
            return min(self.estimate, self.points[0].rate * 0.999) if self.points else self.estimate
        return self.goodput

    def to_dict(self) -> dict:
        return {
            "goodput": self.goodput,
            "status": self.status,
            "estimate": self.estimate,
            "elapsed_s": self.elapsed_s,
            "points": [p.to_dict() for p in self.points],
        }


@dataclass(slots=True)
class BracketConfig:
    """Knobs of the rate search."""

    max_measurements: int = 6
    #: Repeat the final passing rate once (costs one measurement; guards against lucky passes).
    is_confirmed: bool = True
    #: Stop refining when hi/lo is within this factor.
    rel_tol: float = 0.1
    growth: float = 2.0
    #: A measurement passes only if the run lasted at most 1/min_sustained of what a server that
    #: keeps up would need (the sending span plus a median request).
    min_sustained: float = 0.8
    min_rate: float = 0.01
    max_rate: float = 1e6

    def __post_init__(self) -> None:
        assert self.max_measurements >= 1
        assert self.growth > 1 and self.rel_tol > 0 and 0 < self.min_rate < self.max_rate


def _crossing(lo: RatePoint, hi: RatePoint) -> float:
    """Rate where log(worst ratio) crosses 0 between a passing ``lo`` and failing ``hi``."""
    a, b = lo.rate, hi.rate
    ra, rb = max(lo.worst_ratio, 1e-9), hi.worst_ratio
    if not math.isfinite(rb) or rb <= ra:
        return math.sqrt(a * b)
    la, lb = math.log(ra), math.log(rb)
    x = a + (b - a) * (0 - la) / (lb - la)
    return min(max(x, a + 0.1 * (b - a)), b - 0.1 * (b - a))


def overrun(s: BenchSummary, cfg: BracketConfig) -> float | None:
    """None when the server kept up with the offered rate, else how far it fell behind.

    A rate the server does not keep up with is not goodput, even when a short run's
    percentiles pass: the run may last at most 1/min_sustained of (sending span + a
    median request)."""
    e2e = s.latency.get("e2e", {}).get("p50")
    if not (s.offered_rate and math.isfinite(s.offered_rate) and e2e is not None and s.num_requests > 1):
        return None
    span = s.send_span_s if s.send_span_s is not None else (s.num_requests - 1) / s.offered_rate
    expected = span + e2e
    if s.duration_s <= expected / cfg.min_sustained:
        return None
    return s.duration_s * cfg.min_sustained / expected


class _Bracket:
    """One configuration's search state (its measurements so far) with the search's phases as methods,
    so ``find_goodput`` reads as the order of the phases rather than one long loop."""

    def __init__(self, measure: MeasureFn, cfg: BracketConfig, deadline: float | None) -> None:
        self.measure = measure
        self.cfg = cfg
        self.deadline = deadline
        self.t0 = time.monotonic()
        self.points: list[RatePoint] = []

    def probe(self, rate: float, repeat: int = 0) -> RatePoint:
        s = self.measure(rate, repeat)
        ratio = s.worst_slo_ratio()
        assert ratio is not None, "goodput needs at least one SLO"
        lag = overrun(s, self.cfg)
        kept_up = lag is None
        if lag is not None:
            ratio = max(ratio, lag)
        p = RatePoint(rate, bool(s.is_slo_met) and kept_up, ratio, s, repeat)
        self.points.append(p)
        return p

    def budget_left(self, extra: int = 0) -> bool:
        return len(self.points) < self.cfg.max_measurements + extra and (
            self.deadline is None or time.monotonic() < self.deadline
        )

    def done(self, status: str, lo: RatePoint | None, hi: RatePoint | None) -> GoodputResult:
        est = _crossing(lo, hi) if lo is not None and hi is not None else None
        return GoodputResult(lo.rate if lo else 0.0, status, self.points, est, time.monotonic() - self.t0)

    def bracket(
        self, lo: RatePoint | None, hi: RatePoint | None
    ) -> tuple[RatePoint | None, RatePoint | None, GoodputResult | None]:
        """Step the rate by ``growth`` until one pass and one miss bracket the knee; (lo, hi, the
        result when the search ends here: infeasible below ``min_rate``)."""
        cfg = self.cfg
        while self.budget_left() and (lo is None or hi is None):
            if lo is None:
                assert hi is not None  # every probe sets lo or hi, and a failed confirmation sets hi
                rate = hi.rate / cfg.growth
                if rate < cfg.min_rate:
                    return lo, hi, self.done("infeasible", None, hi)
                p = self.probe(rate)
            else:
                rate = lo.rate * cfg.growth
                if rate > cfg.max_rate:
                    break
                p = self.probe(rate)
            if p.is_met:
                lo = p
            else:
                hi = p
        return lo, hi, None

    def narrow(self, lo: RatePoint, hi: RatePoint | None) -> tuple[RatePoint, RatePoint | None]:
        """Bisect (on the interpolated crossing) until pass and miss are within ``rel_tol``."""
        while self.budget_left() and hi is not None and hi.rate / lo.rate > 1 + self.cfg.rel_tol:
            p = self.probe(_crossing(lo, hi))
            if p.is_met:
                lo = p
            else:
                hi = p
        return lo, hi


def find_goodput(
    measure: MeasureFn,
    start_rate: float,
    cfg: BracketConfig | None = None,
    incumbent: float | None = None,
    deadline: float | None = None,
) -> GoodputResult:
    """Search the goodput of the configuration that ``measure(rate)`` measures.

    :param start_rate: first rate to try when there is no incumbent.
    :param incumbent: the best goodput so far; measured first, and the trial stops if it fails there.
    :param deadline: ``time.monotonic()`` after which no new measurement starts.
    """
    cfg = cfg or BracketConfig()
    search = _Bracket(measure, cfg, deadline)
    first = search.probe(incumbent if incumbent else start_rate)
    lo = first if first.is_met else None
    hi = None if first.is_met else first
    if incumbent and not first.is_met:
        # cannot beat the incumbent: estimate where it would pass, for the search's benefit
        est = first.rate / first.worst_ratio if math.isfinite(first.worst_ratio) else first.rate / cfg.growth
        return GoodputResult(0.0, "pruned", search.points, est, time.monotonic() - search.t0)
    confirmed: set[float] = set()
    while True:
        lo, hi, ended = search.bracket(lo, hi)
        if ended is not None:
            return ended
        if lo is None:
            # passes that did not survive their repeat are not goodput, but neither is this infeasible
            status = "unconfirmed" if any(p.is_met for p in search.points) else "infeasible"
            return search.done(status, None, hi)
        lo, hi = search.narrow(lo, hi)
        if not cfg.is_confirmed:
            return search.done("complete", lo, hi)
        if lo.rate in confirmed or not search.budget_left(extra=2):
            return search.done("unconfirmed", lo, hi)  # a winner must have passed twice
        again = search.probe(lo.rate, repeat=1)
        if again.is_met:
            return search.done("complete", lo, hi)
        confirmed.add(lo.rate)
        # the pass was luck: the knee is below; fall back to the best lower pass, if any
        hi = again
        lower = [p for p in search.points if p.is_met and p.rate < again.rate]
        lo = max(lower, key=lambda p: p.rate) if lower else None
