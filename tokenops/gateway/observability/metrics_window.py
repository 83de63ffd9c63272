"""Sliding-window request metrics for ``GET /admin/stats``: rates and latency
percentiles over the last ``window_s`` seconds, and a per-second history ring
(the last ``history_s`` seconds) for the dashboard's charts.

Batch API lines (``priority_class == "batch"``) are kept apart: the figures, counts and history are
interactive traffic's, and the lines of batches have their own block (``batch``: counts, tokens and
latency percentiles, no SLO or history), so a running batch never moves the interactive latency."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tokenops.gateway.observability.records import RequestRecord
from tokenops.slo import SLO

PERCENTILES = (50, 90, 95, 99)
MAX_ITL_SAMPLES = 50_000


def percentile(values: list[float], pct: float) -> float | None:
    """Linear-interpolated percentile (numpy's default) of unsorted ``values``."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * pct / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return s[lo]
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass(slots=True)
class _Sample:
    t: float
    is_ok: bool
    is_error: bool  # outcome "error" (RequestRecord.outcome): rejections and disconnects are not errors
    tokens_in: int
    tokens_out: int
    ttft: float | None
    tpot: float | None
    e2e: float | None
    is_slo_met: bool


@dataclass(slots=True)
class _Second:
    t: int
    num_requests: int = 0
    num_errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)

    def point(self) -> dict[str, Any]:
        return {
            "t": float(self.t),
            "rps": float(self.num_requests),
            "input_tps": float(self.tokens_in),
            "output_tps": float(self.tokens_out),
            "errors": self.num_errors,
            "ttft_p50": percentile(self.ttft, 50),
            "ttft_p95": percentile(self.ttft, 95),
            "tpot_p50": percentile(self.tpot, 50),
            "tpot_p95": percentile(self.tpot, 95),
            "e2e_p50": percentile(self.e2e, 50),
            "e2e_p95": percentile(self.e2e, 95),
        }


class MetricsWindow:
    """Thread-safe; ``add`` is O(1), ``snapshot`` sorts the window's values."""

    def __init__(
        self, window_s: float = 60.0, history_s: int = 300, slos: list[SLO] | None = None, *, is_batch: bool = False
    ) -> None:
        assert window_s > 0 and history_s > 0
        #: the window of batch lines (None in that window itself)
        self.batch: MetricsWindow | None = None if is_batch else MetricsWindow(window_s, 1, is_batch=True)
        self.window_s = window_s
        self.history_s = history_s
        self.slos = list(slos or [])
        self._samples: deque[_Sample] = deque()
        self._itl: deque[tuple[float, float]] = deque(maxlen=MAX_ITL_SAMPLES)
        self._seconds: deque[_Second] = deque()
        self._lock = threading.Lock()
        self.num_total = 0
        self.num_errors = 0
        self.num_rejected = 0
        self.num_disconnected = 0
        self.total_input = 0
        self.total_output = 0
        self._first_second: int | None = None  # history starts at the first request

    def _slo_met(self, rec: RequestRecord) -> bool:
        values = {"ttft": rec.ttft_s, "tpot": rec.tpot_s, "itl": rec.tpot_s, "e2e": rec.e2e_s}
        if not rec.is_ok:
            return False
        return all((value := values[s.metric]) is None or value <= s.threshold_s for s in self.slos)

    def add(self, rec: RequestRecord, now: float | None = None) -> None:
        if self.batch is not None and rec.priority_class == "batch":
            self.batch.add(rec, now)
            return
        now = time.time() if now is None else now
        outcome = rec.outcome
        is_error = outcome == "error"
        sample = _Sample(
            now,
            rec.is_ok,
            is_error,
            rec.tokens_in,
            rec.tokens_out,
            rec.ttft_s,
            rec.tpot_s,
            rec.e2e_s,
            self._slo_met(rec),
        )
        sec = int(now)
        with self._lock:
            self.num_total += 1
            if self._first_second is None:
                self._first_second = sec
            self.num_errors += is_error
            self.num_rejected += outcome == "rejected"
            self.num_disconnected += outcome == "disconnected"
            self.total_input += rec.tokens_in
            self.total_output += rec.tokens_out
            self._samples.append(sample)
            for gap in rec.itl:
                self._itl.append((now, gap))
            if not self._seconds or self._seconds[-1].t < sec:
                self._seconds.append(_Second(sec))
            bucket = self._seconds[-1] if self._seconds[-1].t == sec else self._find(sec)
            if bucket is not None:
                bucket.num_requests += 1
                bucket.num_errors += is_error
                bucket.tokens_in += rec.tokens_in
                bucket.tokens_out += rec.tokens_out
                for name, value in (("ttft", sample.ttft), ("tpot", sample.tpot), ("e2e", sample.e2e)):
                    if value is not None:
                        getattr(bucket, name).append(value)
            self._expire(now)

    def _find(self, sec: int) -> _Second | None:
        for b in reversed(self._seconds):
            if b.t == sec:
                return b
            if b.t < sec:
                return None
        return None

    def _expire(self, now: float) -> None:
        while self._samples and self._samples[0].t < now - self.window_s:
            self._samples.popleft()
        while self._itl and self._itl[0][0] < now - self.window_s:
            self._itl.popleft()
        while self._seconds and self._seconds[0].t < now - self.history_s:
            self._seconds.popleft()

    def snapshot(self, in_flight: int = 0, now: float | None = None) -> dict[str, Any]:
        """The ``requests``, ``tokens``, ``latency``, ``slo`` and ``history`` parts of ``/admin/stats``."""
        now = time.time() if now is None else now
        with self._lock:
            self._expire(now)
            samples = list(self._samples)
            itl = [g for _, g in self._itl]
            seconds = list(self._seconds)
            totals = (self.num_total, self.num_errors, self.total_input, self.total_output)
            others = {"rejected": self.num_rejected, "disconnected": self.num_disconnected}
        span = self.window_s
        ok = [s for s in samples if s.is_ok]
        series = {
            "ttft": [s.ttft for s in ok if s.ttft is not None],
            "tpot": [s.tpot for s in ok if s.tpot is not None],
            "itl": itl,
            "e2e": [s.e2e for s in ok if s.e2e is not None],
        }
        latency = {m: {f"p{p}": percentile(v, p) for p in PERCENTILES} for m, v in series.items()}
        targets = slo_targets(self.slos, series)
        return {
            "window_s": span,
            "requests": {
                "rate_rps": len(samples) / span,
                "total": totals[0],
                "errors": totals[1],
                **others,
                # over the same requests as the counts beside it (since start), so "errors 4 (x%)" agree
                "error_rate": (totals[1] / totals[0]) if totals[0] else 0.0,
                "in_flight": in_flight,
            },
            "tokens": {
                "input_tps": sum(s.tokens_in for s in samples) / span,
                "output_tps": sum(s.tokens_out for s in samples) / span,
                "total_input": totals[2],
                "total_output": totals[3],
            },
            "latency": latency,
            "slo": {
                "targets": targets,
                "attainment": (sum(1 for s in samples if s.is_slo_met) / len(samples)) if samples else None,
            },
            "history": self._history(seconds, int(now)),
            **({} if self.batch is None else {"batch": self._batch_block(now)}),
        }

    def _batch_block(self, now: float) -> dict[str, Any]:
        """The ``batch`` part: batch lines' counts, tokens and latency over the same window."""
        assert self.batch is not None
        snap = self.batch.snapshot(now=now)
        requests = {k: v for k, v in snap["requests"].items() if k != "in_flight"}
        return {"requests": requests, "tokens": snap["tokens"], "latency": snap["latency"]}

    def _history(self, seconds: list[_Second], now_sec: int) -> list[dict[str, Any]]:
        """One point per second (empty seconds included) up to the last complete second."""
        by_t = {b.t: b for b in seconds}
        first = self._first_second if self._first_second is not None else now_sec
        start = max(now_sec - self.history_s, first)
        return [(by_t.get(t) or _Second(t)).point() for t in range(start, now_sec)]


def slo_targets(slos: list[SLO], series: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Each SLO with the value its metric's percentile has in ``series`` and whether it is met."""
    targets = []
    for slo in slos:
        value = percentile(series[slo.metric], slo.percentile)
        targets.append(
            {
                "label": slo.label,
                "metric": slo.metric,
                "percentile": slo.percentile,
                "threshold_s": slo.threshold_s,
                "value_s": value,
                "met": None if value is None else slo.is_met(value),
            }
        )
    return targets
