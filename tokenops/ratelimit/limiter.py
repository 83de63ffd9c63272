"""The rate limiter the ``rate_limit`` plugin drives.

At admission a request is charged one request and its estimated tokens (prompt
estimate + ``max_tokens``) against every bucket that applies to it (its tenant,
model and API key), takes a concurrency slot where a cap is set, and passes the
fair-share check. When it finishes, :meth:`RateLimiter.complete` charges the
difference between the real and the estimated tokens and frees the slot.
Refusals carry ``retry_after_s``; in ``queue`` mode the caller's thread waits up
to ``queue_timeout_s`` first (never on an event-loop thread, where waiting would
stall every other request: there the limiter answers 429 at once).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenops.ratelimit.config import RateLimitConfig
from tokenops.ratelimit.fair_share import FairShare
from tokenops.ratelimit.redis_fallback import FallbackStore
from tokenops.ratelimit.stores import Charge, LocalStore, RedisStore, Slot, Verdict
from tokenops.routing.estimate import estimate_request_tokens
from tokenops.types import Rejection

_KIND_TEXT = {
    "rpm": "requests per minute",
    "tpm": "tokens per minute",
    "conc": "concurrent requests",
    "fair": "fair share of the token capacity",
}


@dataclass(slots=True)
class _Pending:
    tenant: str
    estimate: int
    token_charges: list[Charge]
    slot_keys: list[str]
    started: float
    is_fair: bool = False


@dataclass(slots=True)
class LimiterStats:
    admitted: int = 0
    rejected: int = 0
    queued_s: float = 0.0
    by_reason: dict[str, int] = field(default_factory=dict)


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class RateLimiter:
    def __init__(
        self,
        config: RateLimitConfig,
        store: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        stale_after_s: float = 900.0,
    ) -> None:
        self.config = config
        self.store = store or (FallbackStore(RedisStore(config.redis_url)) if config.redis_url else LocalStore())
        self.clock = clock
        self.sleep = sleep
        self.stale_after_s = stale_after_s
        self.fair = (
            FairShare(config.fair_share_tokens_per_min, config.fair_share_weights, burst_s=config.burst_s)
            if config.fair_share_tokens_per_min
            else None
        )
        self.stats = LimiterStats()
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    # -- what applies to a request --------------------------------------------------

    def _plan(self, request: Any, tokens: int) -> tuple[list[Charge], list[Charge], list[Slot]]:
        cfg = self.config
        names = {"tenant": request.tenant, "model": request.model, "key": getattr(request, "api_key_id", None)}
        requests, token_charges, slots = [], [], []
        for scope, name in names.items():
            if not name:
                continue
            limit = cfg.limit_for(scope, name)
            if limit is None:
                continue
            base = f"{cfg.key_prefix}{scope}:{name}:"
            if limit.requests_per_min:
                rate = limit.requests_per_min / 60.0
                requests.append(Charge(base + "rpm", rate, max(1.0, rate * cfg.burst_s), 1.0))
            if limit.tokens_per_min:
                rate = limit.tokens_per_min / 60.0
                token_charges.append(Charge(base + "tpm", rate, max(1.0, rate * cfg.burst_s), float(tokens)))
            if limit.max_concurrency:
                slots.append(Slot(base + "conc", int(limit.max_concurrency)))
        return requests, token_charges, slots

    # -- admission ------------------------------------------------------------------

    def admit(self, request: Any) -> Rejection | None:
        tokens = estimate_request_tokens(request)
        requests, token_charges, slots = self._plan(request, tokens)
        if not (requests or token_charges or slots or self.fair):
            return None
        start = self.clock()
        can_wait = self.config.mode == "queue" and not _on_event_loop()
        waited = 0.0
        while True:
            now = self.clock()
            verdict = self._try(request.tenant, tokens, requests + token_charges, slots, now)
            if verdict.is_admitted:
                break
            if not can_wait or now - start + verdict.wait_s > self.config.queue_timeout_s:
                return self._reject(request, verdict)
            self.sleep(verdict.wait_s)
            waited = self.clock() - start
        self.stats.admitted += 1
        self.stats.queued_s += waited
        request.decide("rate_limit", "admitted" if waited <= 0 else f"queued:{waited:.3f}s")
        with self._lock:
            self._pending[request.id] = _Pending(
                request.tenant, tokens, token_charges, [s.key for s in slots], now, self.fair is not None
            )
        return None

    def _try(self, tenant: str, tokens: int, charges: list[Charge], slots: list[Slot], now: float) -> Verdict:
        if self.fair is not None:
            wait = self.fair.wait_for(tenant, tokens, now)
            if wait > 0:
                return Verdict(wait, f"{self.config.key_prefix}tenant:{tenant}:fair")
        verdict = self.store.acquire(charges, slots, now)
        if verdict.is_admitted and self.fair is not None:
            self.fair.take(tenant, tokens, now)
        return verdict

    def _reject(self, request: Any, verdict: Verdict) -> Rejection:
        key = verdict.key or ""
        scope_name, _, kind = key[len(self.config.key_prefix) :].rpartition(":")
        scope, _, name = scope_name.partition(":")
        reason = f"{scope}:{kind}"
        self.stats.rejected += 1
        self.stats.by_reason[reason] = self.stats.by_reason.get(reason, 0) + 1
        request.decide("rate_limit", f"rejected:{reason}")
        retry = math.ceil(max(verdict.wait_s, 0.001) * 100) / 100
        return Rejection(
            429,
            f"Rate limit exceeded for {scope} {name!r}: {_KIND_TEXT.get(kind, kind)}. Retry after {retry:.2f} s.",
            code="rate_limit_exceeded",
            retry_after_s=retry,
        )

    # -- completion -----------------------------------------------------------------

    def complete(self, request_id: str, actual_tokens: int | None) -> bool:
        """Correct the token charge to ``actual_tokens`` and free the concurrency slot.
        False when the request was not admitted here (or already completed)."""
        with self._lock:
            pending = self._pending.pop(request_id, None)
        if pending is None:
            return False
        now = self.clock()
        if actual_tokens is not None:
            delta = pending.estimate - actual_tokens
            if delta:
                for charge in pending.token_charges:
                    self.store.adjust(charge, delta, now)
                if pending.is_fair and self.fair is not None:
                    self.fair.adjust(pending.tenant, delta, now)
        if pending.slot_keys:
            self.store.release(pending.slot_keys)
        return True

    def expire_stale(self) -> int:
        """Free the slots of requests whose completion never arrived."""
        cutoff = self.clock() - self.stale_after_s
        with self._lock:
            stale = [rid for rid, p in self._pending.items() if p.started < cutoff]
        for rid in stale:
            self.complete(rid, None)
        return len(stale)

    @property
    def num_pending(self) -> int:
        return len(self._pending)
