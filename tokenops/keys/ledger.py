"""Spend per budget period: committed USD (settled cost plus the estimates of
requests still running) under one ledger key per scope and period, e.g.
``tokenops:budget:key:key_ab12:1764547200``. A new period is a new ledger key,
so budgets reset by themselves.

:meth:`reserve` checks and charges all of a request's ledger keys (its key and
its tenant) atomically: refused when any of them is already at or over its
limit, else the estimate is added to all. The Redis ledger does this in one Lua
script (INCRBYFLOAT), so every gateway replica sharing the Redis shares the
budget; the local ledger does it under a lock for one process.
"""

from __future__ import annotations

import threading
from typing import Sequence

#: (ledger key, hard limit in USD or None)
Entry = tuple[str, "float | None"]


class LocalLedger:
    def __init__(self) -> None:
        self._spent: dict[str, float] = {}
        self._lock = threading.Lock()

    def reserve(self, entries: Sequence[Entry], amount: float, ttl_s: float = 0) -> tuple[int, list[float]]:
        """``(-1, committed after)`` when charged, else ``(index of the refusing entry, committed)``."""
        with self._lock:
            values = [self._spent.get(k, 0.0) for k, _ in entries]
            for i, ((_, limit), value) in enumerate(zip(entries, values)):
                if limit is not None and value >= limit:
                    return i, values
            for k, _ in entries:
                self._spent[k] = self._spent.get(k, 0.0) + amount
            return -1, [v + amount for v in values]

    def adjust(self, keys: Sequence[str], delta: float, ttl_s: float = 0) -> None:
        if not delta:
            return
        with self._lock:
            for k in keys:
                self._spent[k] = self._spent.get(k, 0.0) + delta

    def committed(self, keys: Sequence[str]) -> list[float]:
        with self._lock:
            return [self._spent.get(k, 0.0) for k in keys]

    def seed(self, key: str, value: float, ttl_s: float = 0) -> None:
        """Start a period at ``value`` (spend recorded before a restart) unless it is known already."""
        with self._lock:
            self._spent.setdefault(key, value)

    def forget_before(self, prefix: str, keep: set[str]) -> None:
        with self._lock:
            for k in [k for k in self._spent if k.startswith(prefix) and k not in keep]:
                del self._spent[k]


_RESERVE = """
local amount = ARGV[1]
local ttl = tonumber(ARGV[2])
local values = {}
for i = 1, #KEYS do
  local v = tonumber(redis.call('GET', KEYS[i]) or '0')
  values[i] = v
  local limit = tonumber(ARGV[2 + i])
  if limit >= 0 and v >= limit then
    local out = {}
    for j = 1, i do out[j] = tostring(values[j]) end
    return {i, table.concat(out, ',')}
  end
end
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('INCRBYFLOAT', KEYS[i], amount)
  redis.call('EXPIRE', KEYS[i], ttl)
end
return {0, table.concat(out, ',')}
"""


class RedisLedger:
    """The ledger in Redis, shared by every gateway replica pointing at it."""

    def __init__(self, client) -> None:
        self.client = client
        self._reserve = client.register_script(_RESERVE)

    def reserve(self, entries: Sequence[Entry], amount: float, ttl_s: float = 86400) -> tuple[int, list[float]]:
        args = [repr(float(amount)), int(max(60, ttl_s))] + [(-1 if limit is None else repr(float(limit)))
                                                               for _, limit in entries]
        refused, values = self._reserve(keys=[k for k, _ in entries], args=args)
        values = [float(v) for v in (values.decode() if isinstance(values, bytes) else values).split(",") if v]
        return int(refused) - 1, values

    def adjust(self, keys: Sequence[str], delta: float, ttl_s: float = 86400) -> None:
        if not delta:
            return
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.incrbyfloat(k, delta)
            pipe.expire(k, int(max(60, ttl_s)))
        pipe.execute()

    def committed(self, keys: Sequence[str]) -> list[float]:
        if not keys:
            return []
        return [float(v) if v is not None else 0.0 for v in self.client.mget(list(keys))]

    def seed(self, key: str, value: float, ttl_s: float = 86400) -> None:
        self.client.set(key, repr(float(value)), nx=True, ex=int(max(60, ttl_s)))

    def forget_before(self, prefix: str, keep: set[str]) -> None:
        pass  # Redis keys expire by themselves
