"""``GatewayCounters``: what one gateway has counted since it started — routes, cache lookups,
escalations and per-model totals — as typed fields, not string-keyed dicts. The pipeline's
``on_finish`` adds each finished request; ``GET /admin/stats`` reads a snapshot."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tokenops.gateway.observability.records import RequestRecord


@dataclass(slots=True)
class ModelCounts:
    """One model's totals (the model served, else the one asked for)."""

    num_requests: int = 0
    num_errors: int = 0
    num_rejected: int = 0
    num_disconnected: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: None until a reasoning model reports thinking tokens
    reasoning_tokens: int | None = None
    cost_usd: float = 0.0

    def add(self, rec: RequestRecord) -> None:
        self.num_requests += 1
        outcome = rec.outcome  # one definition of an error everywhere (RequestRecord.outcome)
        if outcome == "error":
            self.num_errors += 1
        elif outcome == "rejected":
            self.num_rejected += 1
        elif outcome == "disconnected":
            self.num_disconnected += 1
        self.input_tokens += rec.tokens_in
        self.output_tokens += rec.tokens_out
        if rec.reasoning_tokens is not None:  # reasoning models: the share of output spent thinking
            self.reasoning_tokens = (self.reasoning_tokens or 0) + rec.reasoning_tokens
        self.cost_usd += rec.cost_usd

    def copy(self) -> ModelCounts:
        return ModelCounts(
            self.num_requests,
            self.num_errors,
            self.num_rejected,
            self.num_disconnected,
            self.input_tokens,
            self.output_tokens,
            self.reasoning_tokens,
            self.cost_usd,
        )


@dataclass(slots=True)
class CacheCounts:
    num_lookups: int = 0
    num_hits: int = 0


@dataclass(slots=True)
class CountsSnapshot:
    """A consistent copy of the counters (taken under their lock)."""

    routes: dict[str, int]
    cache: CacheCounts
    num_escalations: int
    per_model: dict[str, ModelCounts]
    #: model -> cost of its requests within the window (USD)
    window_cost_usd: dict[str, float]


@dataclass
class GatewayCounters:
    """Counts of finished requests; ``add`` runs on the event loop, ``snapshot`` from admin threads."""

    #: how far back ``window_cost_usd`` looks (the metrics window)
    window_s: float = 60.0
    routes: dict[str, int] = field(default_factory=dict)
    cache: CacheCounts = field(default_factory=CacheCounts)
    num_escalations: int = 0
    per_model: dict[str, ModelCounts] = field(default_factory=dict)
    _costs: deque[tuple[float, str, float]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, rec: RequestRecord, now: float | None = None) -> None:
        now = time.time() if now is None else now
        model = rec.model_served or rec.model_requested
        with self._lock:
            if rec.route_reason:
                self.routes[rec.route_reason] = self.routes.get(rec.route_reason, 0) + 1
            if "cache" in rec.decisions:
                self.cache.num_lookups += 1
                self.cache.num_hits += 1 if rec.is_cache_hit else 0
            self.num_escalations += 1 if rec.is_escalated else 0
            self.per_model.setdefault(model, ModelCounts()).add(rec)
            self._costs.append((now, model, rec.cost_usd))
            while self._costs and self._costs[0][0] < now - self.window_s:
                self._costs.popleft()

    def snapshot(self) -> CountsSnapshot:
        with self._lock:
            window_cost: dict[str, float] = {}
            for _, model, cost in self._costs:
                window_cost[model] = window_cost.get(model, 0.0) + cost
            return CountsSnapshot(
                routes=dict(self.routes),
                cache=CacheCounts(self.cache.num_lookups, self.cache.num_hits),
                num_escalations=self.num_escalations,
                per_model={k: v.copy() for k, v in self.per_model.items()},
                window_cost_usd=window_cost,
            )

    def model_rows(self, snap: CountsSnapshot, models: list[str]) -> dict[str, dict[str, Any]]:
        """The ``models`` section of ``GET /admin/stats``: every configured or seen model."""
        total = sum(m.num_requests for m in snap.per_model.values()) or 1
        rows = {}
        for name in sorted(set(models) | set(snap.per_model)):
            m = snap.per_model.get(name) or ModelCounts()
            rows[name] = {
                "requests": m.num_requests,
                "errors": m.num_errors,
                "rejected": m.num_rejected,
                "disconnected": m.num_disconnected,
                "error_rate": m.num_errors / m.num_requests if m.num_requests else 0.0,
                "input_tokens": m.input_tokens,
                "output_tokens": m.output_tokens,
                "cost_usd": m.cost_usd,
                "share": m.num_requests / total,
                "reasoning_tokens": m.reasoning_tokens,
                "cost_per_hour_usd": snap.window_cost_usd.get(name, 0.0) * 3600.0 / self.window_s,
            }
        return rows
