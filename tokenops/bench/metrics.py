"""Per-request measurements and SLO-aware aggregates.

Goodput follows DistServe: the number of requests per second that meet *every*
SLO (each request judged on its own TTFT / TPOT / ITL / E2E). The percentile
SLOs themselves are judged on the whole distribution, with failed requests
counted as infinitely slow so that errors can never make a run look better.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from tokenops.slo import SLO

PERCENTILES = (50.0, 90.0, 95.0, 99.0)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(slots=True)
class RequestResult:
    """What one streamed request measured (seconds, relative to the run start)."""

    start_s: float
    is_ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itls_s: list[float] = field(default_factory=list)
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    #: True when the server reported usage; False when tokens were counted from chunks.
    is_usage_reported: bool = False
    conversation: int | None = None
    turn: int = 0

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (None for single-token answers)."""
        if not self.is_ok or self.ttft_s is None or self.e2e_s is None or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)

    def value(self, metric: str, percentile: float = 50.0) -> float | None:
        """This request's value for an SLO metric (its own ITL percentile for ``itl``)."""
        if metric == "ttft":
            return self.ttft_s
        if metric == "e2e":
            return self.e2e_s
        if metric == "tpot":
            return self.tpot_s
        if metric == "itl":
            return float(np.percentile(self.itls_s, percentile)) if self.itls_s else None
        raise ValueError(f"unknown metric {metric!r}")

    def meets(self, slos: Iterable[SLO]) -> bool:
        """Whether this request met every SLO; a missing value (one token) does not fail it."""
        if not self.is_ok:
            return False
        for slo in slos:
            v = self.value(slo.metric, slo.percentile)
            if v is not None and v > slo.threshold_s:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tpot_s"] = self.tpot_s
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestResult:
        d = {k: v for k, v in d.items() if k != "tpot_s"}
        return cls(**d)


def percentile(values: list[float] | np.ndarray, pct: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), pct))


def distribution(values: list[float]) -> dict[str, float | None]:
    """mean and p50/p90/p95/p99 of ``values``."""
    out: dict[str, float | None] = {"mean": float(np.mean(values)) if values else None}
    for p in PERCENTILES:
        out[f"p{p:g}"] = percentile(values, p)
    return out


def metric_values(results: list[RequestResult], metric: str) -> list[float]:
    """Every successful request's samples of ``metric`` (ITL pools all gaps)."""
    if metric == "itl":
        return [g for r in results if r.is_ok for g in r.itls_s]
    vals = [r.value(metric) for r in results if r.is_ok]
    return [v for v in vals if v is not None]


def slo_value(results: list[RequestResult], slo: SLO) -> float | None:
    """The SLO's percentile over the run, failed requests counted as +inf."""
    if slo.metric == "itl":
        vals = metric_values(results, "itl")
        num_failed = sum(1 for r in results if not r.is_ok)
        vals = vals + [math.inf] * num_failed
    else:
        raw = [(r.value(slo.metric) if r.is_ok else math.inf) for r in results]
        vals = [v for v in raw if v is not None]
    if not vals:
        return None
    # numpy interpolation with inf yields nan; use the "higher" rank when infinities are present.
    arr = np.asarray(vals, dtype=float)
    method: Literal["linear", "higher"] = "linear" if np.isfinite(arr).all() else "higher"
    return float(np.percentile(arr, slo.percentile, method=method))


@dataclass(slots=True)
class BenchSummary:
    """Aggregates of one run at one load level."""

    num_requests: int
    num_completed: int
    num_errors: int
    errors: dict[str, int]
    duration_s: float
    request_rate: float
    input_tps: float
    output_tps: float
    total_input_tokens: int
    total_output_tokens: int
    latency: dict[str, dict[str, float | None]]
    slo: list[dict[str, Any]]
    #: Share of all requests that met every SLO (None without SLOs).
    attainment: float | None
    #: Requests per second that met every SLO (None without SLOs).
    goodput_rps: float | None
    #: Every percentile SLO met over the run (None without SLOs).
    is_slo_met: bool | None
    offered_rate: float | None = None
    concurrency: int | None = None
    #: Seconds from the first request sent to the last one sent.
    send_span_s: float | None = None
    #: Prefix-cache hits per queried prompt token during this level, from the server's /metrics (None: not exposed).
    prefix_cache_hit_rate: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchSummary:
        d = dict(d)
        if isinstance(d.get("offered_rate"), str):  # "inf" in JSON
            d["offered_rate"] = float(d["offered_rate"])
        return cls(**d)

    def worst_slo_ratio(self) -> float | None:
        """max over SLOs of value / threshold (> 1 means missed); inf when unmeasurable."""
        ratios = []
        for s in self.slo:
            v = s["value_s"]
            ratios.append(math.inf if v is None else v / s["threshold_s"])
        return max(ratios) if ratios else None


def summarize(
    results: list[RequestResult],
    duration_s: float,
    slos: list[SLO] | None = None,
    offered_rate: float | None = None,
    concurrency: int | None = None,
) -> BenchSummary:
    """Aggregate a run; ``duration_s`` is the wall time from the first send to the last answer."""
    assert duration_s >= 0
    slos = slos or []
    ok = [r for r in results if r.is_ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.is_ok:
            key = r.error or "error"
            errors[key] = errors.get(key, 0) + 1
    dur = duration_s if duration_s > 0 else math.nan
    num_in = sum(r.num_input_tokens for r in ok)
    num_out = sum(r.num_output_tokens for r in ok)
    latency = {m: distribution(metric_values(results, m)) for m in LATENCY_METRICS}
    slo_rows = []
    for s in slos:
        v = slo_value(results, s)
        slo_rows.append(
            {
                "label": s.label,
                "metric": s.metric,
                "percentile": s.percentile,
                "threshold_s": s.threshold_s,
                "value_s": None if v is None or math.isinf(v) else v,
                "met": v is not None and s.is_met(v),
            }
        )
    attainment: float | None
    goodput: float | None
    is_met: bool | None
    if slos and results:
        num_good = sum(1 for r in results if r.meets(slos))
        attainment = num_good / len(results)
        goodput = num_good / dur if duration_s > 0 else None
        is_met = all(row["met"] for row in slo_rows)
    else:
        attainment = goodput = is_met = None
    return BenchSummary(
        num_requests=len(results),
        num_completed=len(ok),
        num_errors=len(results) - len(ok),
        errors=errors,
        duration_s=duration_s,
        request_rate=len(ok) / dur if duration_s > 0 else 0.0,
        input_tps=num_in / dur if duration_s > 0 else 0.0,
        output_tps=num_out / dur if duration_s > 0 else 0.0,
        total_input_tokens=num_in,
        total_output_tokens=num_out,
        latency=latency,
        slo=slo_rows,
        attainment=attainment,
        goodput_rps=goodput,
        is_slo_met=is_met,
        offered_rate=offered_rate,
        concurrency=concurrency,
        send_span_s=(max(r.start_s for r in results) - min(r.start_s for r in results)) if results else None,
    )
