"""The record of one finished request: the telemetry row, the admin API's recent
list, the sliding-window metrics and the Prometheus histograms all read it."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenops.types import Decisions


@dataclass(slots=True)
class RequestRecord:
    id: str
    kind: str
    tenant: str
    model_requested: str
    arrival: float  # wall clock (time.time) of arrival
    start: float  # time.perf_counter at arrival
    is_stream: bool = False
    model_served: str | None = None
    backend: str | None = None  # replica name
    backend_kind: str | None = None  # local | openai | ...
    api_key_id: str | None = None
    route_reason: str | None = None
    status: int = 200
    error: str | None = None
    error_kind: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    #: Completion tokens spent thinking (in ``tokens_out``), when the backend counts them.
    reasoning_tokens: int | None = None
    first_token_at: float | None = None  # perf_counter of the first content token
    end: float | None = None
    is_cache_hit: bool = False
    is_escalated: bool = False
    cost_usd: float = 0.0
    finish_reason: str | None = None
    #: From the engine when it reports them (bundled engine): scheduler wait and prefill seconds.
    queue_s: float | None = None
    prefill_s: float | None = None
    #: inter-token gaps (seconds per token) measured between streamed deltas
    itl: list[float] = field(default_factory=list)
    decisions: Decisions = field(default_factory=Decisions)  # the request's own dict (tokenops.types)
    #: The request's open trace (tokenops.gateway.observability.tracing), None while tracing is off.
    trace: Any = None
    #: "interactive" or "batch" (a Batch API line: priced at [batches] discount), and its batch.
    priority_class: str = "interactive"
    batch_id: str | None = None

    @property
    def is_ok(self) -> bool:
        return self.status < 400

    @property
    def e2e_s(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_at is None:
            return None
        return self.first_token_at - self.start

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first_token_at is None or self.end is None or self.tokens_out < 2:
            return None
        return (self.end - self.first_token_at) / (self.tokens_out - 1)

    def finish(self, status: int | None = None, error: str | None = None, error_kind: str | None = None) -> None:
        self.end = time.perf_counter()
        if status is not None:
            self.status = status
        if error is not None:
            self.error = error
        if error_kind is not None:
            self.error_kind = error_kind

    @property
    def outcome(self) -> str:
        """The one definition of an error, shared by ``report`` (the store's ``status``), the dashboard
        (``/admin/stats``) and ``/metrics``: ``ok``; ``rejected`` (admission, auth, validation: 4xx);
        ``disconnected`` (499: the client left; not the server's failure); ``error`` (5xx)."""
        if self.status < 400:
            return "ok"
        if self.status == 499:
            return "disconnected"
        return "rejected" if self.status < 500 else "error"

    def row(self) -> dict[str, Any]:
        """The ``requests`` telemetry row (columns of the store's ``requests`` table)."""
        route: Mapping[str, Any] = self.decisions.get("route") or {}
        return {
            "id": self.id,
            "ts": self.arrival,
            "tenant": self.tenant,
            "api_key_id": self.api_key_id,
            "model_requested": self.model_requested,
            "model_served": self.model_served,
            "backend": self.backend_kind,
            "replica": self.backend,
            "route_reason": self.route_reason,
            "router": route.get("router"),
            "cache_hit": self.is_cache_hit,
            "escalated": self.is_escalated,
            "ensemble_members": (self.decisions.get("ensemble") or {}).get("members"),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "tokens_cached": self.tokens_cached,
            "reasoning_tokens": self.reasoning_tokens,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s,
            "status": self.outcome,
            "error_kind": self.error_kind,
            "http_status": self.status,
            "stream": self.is_stream,
            "cost_usd": self.cost_usd,
            "decisions": json.dumps(self.decisions, default=str, separators=(",", ":")),
            "batch_id": self.batch_id,
            "priority_class": self.priority_class,
        }

    def summary(self) -> dict[str, Any]:
        """The ``GET /admin/requests`` entry."""
        row = self.row()
        row.update(kind=self.kind, error=self.error, finish_reason=self.finish_reason, decisions=self.decisions)
        return row
