"""Where bucket levels and concurrency counters live: this process, or Redis.

Both stores take all of a request's charges atomically: either every bucket has
enough and every concurrency slot is free, and all are taken, or nothing is
taken and the caller learns how long to wait. The Redis store does this in one
Lua script (Redis runs scripts atomically) with Redis' own clock, so any number
of gateway processes share the same limits.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from tokenops.ratelimit.token_bucket import TokenBucket

#: Retry hint when a concurrency cap (not a rate) refused the request.
CONCURRENCY_RETRY_S = 1.0


@dataclass(slots=True, frozen=True)
class Charge:
    key: str
    rate_per_s: float
    capacity: float
    amount: float


@dataclass(slots=True, frozen=True)
class Slot:
    key: str
    limit: int


@dataclass(slots=True, frozen=True)
class Verdict:
    wait_s: float  # 0: admitted and charged
    key: str | None = None  # the bucket or slot that refused

    @property
    def is_admitted(self) -> bool:
        return self.wait_s <= 0


class LocalStore:
    """Buckets and counters in this process (one gateway)."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}
        self._slots: dict[str, int] = {}
        self._lock = threading.Lock()

    def _bucket(self, c: Charge, now: float) -> TokenBucket:
        b = self._buckets.get(c.key)
        if b is None or b.rate_per_s != c.rate_per_s or b.capacity != c.capacity:
            level = b.level if b is not None else c.capacity
            b = self._buckets[c.key] = TokenBucket(c.rate_per_s, c.capacity, min(level, c.capacity), now)
        return b

    def acquire(self, charges: Sequence[Charge], slots: Sequence[Slot], now: float) -> Verdict:
        with self._lock:
            worst = Verdict(0.0)
            for c in charges:
                wait = self._bucket(c, now).wait_for(c.amount, now)
                if wait > worst.wait_s:
                    worst = Verdict(wait, c.key)
            for s in slots:
                if self._slots.get(s.key, 0) >= s.limit and worst.wait_s < CONCURRENCY_RETRY_S:
                    worst = Verdict(CONCURRENCY_RETRY_S, s.key)
            if not worst.is_admitted:
                return worst
            for c in charges:
                self._bucket(c, now).take(c.amount, now)
            for s in slots:
                self._slots[s.key] = self._slots.get(s.key, 0) + 1
            return worst

    def adjust(self, charge: Charge, delta: float, now: float) -> None:
        with self._lock:
            self._bucket(charge, now).adjust(delta, now)

    def release(self, slot_keys: Sequence[str]) -> None:
        with self._lock:
            for key in slot_keys:
                self._slots[key] = max(0, self._slots.get(key, 0) - 1)

    def level(self, key: str) -> float | None:
        b = self._buckets.get(key)
        return None if b is None else b.level


_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local nb = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local wait, worst = 0, 0
local levels = {}
for i = 1, nb do
  local base = 3 + (i - 1) * 3
  local rate, cap, amount = tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local v = redis.call('HMGET', KEYS[i], 'level', 'ts')
  local level, ts = tonumber(v[1]), tonumber(v[2])
  if level == nil then level, ts = cap, now end
  if now > ts then level = math.min(cap, level + (now - ts) * rate) end
  levels[i] = level
  local need = math.min(amount, cap)
  if level < need and (need - level) / rate > wait then wait, worst = (need - level) / rate, i end
end
for j = 1, #KEYS - nb do
  local limit = tonumber(ARGV[3 + nb * 3 + j - 1])
  local cur = tonumber(redis.call('GET', KEYS[nb + j]) or '0')
  if cur >= limit and wait < tonumber(ARGV[#ARGV]) then wait, worst = tonumber(ARGV[#ARGV]), nb + j end
end
if wait > 0 then return {0, tostring(wait), worst} end
for i = 1, nb do
  local base = 3 + (i - 1) * 3
  redis.call('HSET', KEYS[i], 'level', tostring(levels[i] - tonumber(ARGV[base + 2])), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[i], ttl)
end
for j = 1, #KEYS - nb do
  redis.call('INCR', KEYS[nb + j])
  redis.call('EXPIRE', KEYS[nb + j], ttl)
end
return {1, '0', 0}
"""

_ADJUST = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, cap, delta = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'level', 'ts')
local level, ts = tonumber(v[1]), tonumber(v[2])
if level == nil then level, ts = cap, now end
if now > ts then level = math.min(cap, level + (now - ts) * rate) end
level = math.min(cap, level + delta)
redis.call('HSET', KEYS[1], 'level', tostring(level), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
return tostring(level)
"""

_RELEASE = """
local v = redis.call('DECR', KEYS[1])
if v < 0 then redis.call('SET', KEYS[1], 0) end
return v
"""


class RedisStore:
    """Buckets and counters in Redis, shared by every gateway that points at it."""

    def __init__(self, url: str, ttl_s: int = 3600, client=None) -> None:
        if client is None:
            try:
                import redis
            except ImportError:
                raise RuntimeError(
                    "rate_limit.redis_url needs the redis client: pip install 'tokenops[redis]'"
                ) from None
            client = redis.Redis.from_url(url, socket_timeout=2.0)
        self.client = client
        self.ttl_s = ttl_s
        self._acquire = client.register_script(_ACQUIRE)
        self._adjust = client.register_script(_ADJUST)
        self._release = client.register_script(_RELEASE)

    def acquire(self, charges: Sequence[Charge], slots: Sequence[Slot], now: float) -> Verdict:
        args: list = [len(charges), self.ttl_s]
        for c in charges:
            args += [repr(float(c.rate_per_s)), repr(float(c.capacity)), repr(float(c.amount))]
        args += [s.limit for s in slots] + [CONCURRENCY_RETRY_S]
        keys = [c.key for c in charges] + [s.key for s in slots]
        ok, wait, worst = self._acquire(keys=keys, args=args)
        if int(ok):
            return Verdict(0.0)
        return Verdict(float(wait), keys[int(worst) - 1] if int(worst) else None)

    def adjust(self, charge: Charge, delta: float, now: float) -> None:
        self._adjust(keys=[charge.key], args=[charge.rate_per_s, charge.capacity, delta, self.ttl_s])

    def release(self, slot_keys: Sequence[str]) -> None:
        for key in slot_keys:
            self._release(keys=[key])

    def level(self, key: str) -> float | None:
        value = self.client.hget(key, "level")
        return None if value is None else float(value)
