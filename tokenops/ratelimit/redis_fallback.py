"""Rate limits while Redis does not answer: each gateway falls back to its own buckets.

``[plugins.rate_limit] redis_url`` keeps every bucket and concurrency counter in Redis so the
gateways share one limit exactly. When Redis does not answer (down, restarting, cut off), a
request must neither fail with a 500 nor pass unlimited: :class:`FallbackStore` takes it from this
gateway's own :class:`~tokenops.ratelimit.stores.LocalStore` instead, so each limit then holds per
gateway (with N gateways a client can get up to N times the limit until Redis is back). Redis is
tried again ``retry_s`` after the failure; from then on the shared buckets count again. Logged
(the first failure and every hundredth request served from the fallback) and counted
(``num_fallback``).

A slot taken in the fallback is freed there; a slot taken in Redis whose release fails while Redis
is away stays taken in Redis until the counter's TTL (``ttl_s`` of the store, an hour by default)
or until Redis restarts empty.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from tokenops.ratelimit.stores import Charge, LocalStore, RedisStore, Slot, Verdict

log = logging.getLogger(__name__)


class FallbackStore:
    """A :class:`RedisStore` with this process's :class:`LocalStore` behind it."""

    def __init__(self, redis_store: RedisStore, local: LocalStore | None = None, retry_s: float = 5.0) -> None:
        import redis

        self.redis = redis_store
        self.local = local or LocalStore()
        self.retry_s = retry_s
        self.num_fallback = 0  # requests admitted (or refused) by this gateway's own buckets
        self._errors = (redis.RedisError, OSError)
        self._retry_at = 0.0
        self._local_slots: dict[str, int] = {}  # slot key -> slots this process holds in the fallback
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        return self.redis.client

    @property
    def is_degraded(self) -> bool:
        return time.monotonic() < self._retry_at

    def _failed(self, error: Exception) -> None:
        if not self.is_degraded:
            log.warning(
                "rate limits: Redis unavailable (%s); each gateway applies the limits alone for %.0f s",
                error,
                self.retry_s,
            )
        self._retry_at = time.monotonic() + self.retry_s

    def acquire(self, charges: Sequence[Charge], slots: Sequence[Slot], now: float) -> Verdict:
        if not self.is_degraded:
            try:
                return self.redis.acquire(charges, slots, now)
            except self._errors as e:
                self._failed(e)
        verdict = self.local.acquire(charges, slots, now)
        self.num_fallback += 1
        if self.num_fallback % 100 == 1 and self.num_fallback > 1:
            log.warning("rate limits: %d requests limited by this gateway alone (Redis away)", self.num_fallback)
        if verdict.is_admitted:
            with self._lock:
                for s in slots:
                    self._local_slots[s.key] = self._local_slots.get(s.key, 0) + 1
        return verdict

    def adjust(self, charge: Charge, delta: float, now: float) -> None:
        if not self.is_degraded:
            try:
                self.redis.adjust(charge, delta, now)
                return
            except self._errors as e:
                self._failed(e)
        self.local.adjust(charge, delta, now)

    def release(self, slot_keys: Sequence[str]) -> None:
        local, shared = [], []
        with self._lock:
            for key in slot_keys:
                held = self._local_slots.get(key, 0)
                if held:
                    self._local_slots[key] = held - 1
                    local.append(key)
                else:
                    shared.append(key)
        if local:
            self.local.release(local)
        if shared:
            try:
                self.redis.release(shared)
            except self._errors as e:
                self._failed(e)
                log.warning("rate limits: %d concurrency slot(s) stay taken in Redis until their TTL", len(shared))

    def level(self, key: str) -> float | None:
        if not self.is_degraded:
            try:
                return self.redis.level(key)
            except self._errors as e:
                self._failed(e)
        return self.local.level(key)
