"""Spend per budget: committed USD (settled cost plus the estimates of requests
still running) in ledger buckets, one per scope, period and bucket start, e.g.
``tokenops:budget:key:key_ab12:daily:1764547200``. A fixed period is one bucket
(a new period is a new bucket, so budgets reset by themselves); a rolling window
sums its buckets.

:meth:`reserve` checks and charges all of a request's budgets (its key's and its
tenant's) atomically: refused when any of them has already reached its limit,
else the estimate is added to the current bucket of each. The Redis ledger does
this in one Lua script (INCRBYFLOAT), so every gateway replica sharing the Redis
shares the budget; the local ledger does it under a lock for one process.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence

log = logging.getLogger("tokenops.keys")

#: (bucket keys summed, oldest first - the last is charged -, hard limit in USD or None)
Entry = tuple[Sequence[str], "float | None"]

#: Spend within this fraction of a limit counts as reaching it: a bucket is a sum of
#: estimates and settlements (``+estimate``, then ``cost - estimate``) whose floating-point
#: rounding depends on the order they land in, so ten requests of cost ``c`` may sum to a
#: hair under ``10 * c`` and let an eleventh through. The Lua script uses the same rule.
LIMIT_TOLERANCE = 1e-9


def reached(spent: float, limit: float) -> bool:
    return spent >= limit * (1 - LIMIT_TOLERANCE)


class LocalLedger:
    """The ledger in this process. Buckets are forgotten ``ttl_s`` after their last write
    (checked every :data:`PRUNE_EVERY` reservations), as Redis expires its keys."""

    PRUNE_EVERY = 1024

    def __init__(self, clock=time.monotonic) -> None:
        self._spent: dict[str, float] = {}
        self._expires: dict[str, float] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._num_reserved = 0

    def _touch(self, key: str, ttl_s: float) -> None:
        if ttl_s:
            self._expires[key] = max(self._expires.get(key, 0.0), self._clock() + ttl_s)

    def _prune(self) -> None:
        now = self._clock()
        for key in [k for k, t in self._expires.items() if t < now]:
            self._expires.pop(key, None)
            self._spent.pop(key, None)

    def reserve(self, entries: Sequence[Entry], amount: float, ttl_s: float = 0) -> tuple[int, list[float]]:
        """``(-1, committed sums after)`` when charged, else ``(index of the refusing entry, sums)``."""
        with self._lock:
            self._num_reserved += 1
            if self._num_reserved % self.PRUNE_EVERY == 0:
                self._prune()
            sums = [sum(self._spent.get(k, 0.0) for k in keys) for keys, _ in entries]
            for i, ((_, limit), value) in enumerate(zip(entries, sums)):
                if limit is not None and reached(value, limit):
                    return i, sums
            for keys, _ in entries:
                self._spent[keys[-1]] = self._spent.get(keys[-1], 0.0) + amount
                self._touch(keys[-1], ttl_s)
            return -1, [v + amount for v in sums]

    def adjust(self, keys: Sequence[str], delta: float, ttl_s: float = 0) -> None:
        if not delta:
            return
        with self._lock:
            for k in keys:
                self._spent[k] = self._spent.get(k, 0.0) + delta
                self._touch(k, ttl_s)

    def committed(self, keys: Sequence[str], flush: bool = True) -> list[float]:
        with self._lock:
            return [self._spent.get(k, 0.0) for k in keys]

    def seed(self, key: str, value: float, ttl_s: float = 0) -> None:
        """Start a bucket at ``value`` (spend recorded before a restart) unless it is known already."""
        with self._lock:
            if key not in self._spent:
                self._spent[key] = value
                self._touch(key, ttl_s)

    @property
    def num_buckets(self) -> int:
        return len(self._spent)


_RESERVE = """
local amount = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local sums = {}
local pos = 1
for i = 1, n do
  local count, limit = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local s = 0
  for j = pos, pos + count - 1 do s = s + tonumber(redis.call('GET', KEYS[j]) or '0') end
  sums[i] = s
  if limit >= 0 and s >= limit * (1 - 1e-9) then return {i, string.format('%.17g', s)} end
  pos = pos + count
end
local out = {}
pos = 1
for i = 1, n do
  local count = tonumber(ARGV[2 + 2 * i])
  local last = KEYS[pos + count - 1]
  redis.call('INCRBYFLOAT', last, ARGV[1])
  redis.call('EXPIRE', last, ttl)
  out[i] = string.format('%.17g', sums[i] + amount)
  pos = pos + count
end
return {0, table.concat(out, ',')}
"""


class RedisLedger:
    """The ledger in Redis, shared by every gateway replica pointing at it.

    Settlements (:meth:`adjust`) go to Redis from a background thread, off the request
    path and the event loop; until one lands the ledger holds the larger estimate, so
    the budget is only ever checked against too much spend, never too little. Reads for
    views (:meth:`committed`) wait for queued settlements first.
    """

    def __init__(self, client) -> None:
        self.client = client
        self._reserve = client.register_script(_RESERVE)
        self._settlements: queue.SimpleQueue = queue.SimpleQueue()
        self._num_queued = 0
        self._idle = threading.Condition()
        self._worker: threading.Thread | None = None

    def reserve(self, entries: Sequence[Entry], amount: float, ttl_s: float = 86400) -> tuple[int, list[float]]:
        args: list = [repr(float(amount)), int(max(60, ttl_s)), len(entries)]
        keys: list[str] = []
        for bucket_keys, limit in entries:
            args += [len(bucket_keys), -1 if limit is None else repr(float(limit))]
            keys += list(bucket_keys)
        refused, values = self._reserve(keys=keys, args=args)
        values = [float(v) for v in (values.decode() if isinstance(values, bytes) else values).split(",") if v]
        if int(refused):
            return int(refused) - 1, [0.0] * (int(refused) - 1) + values
        return -1, values

    def adjust(self, keys: Sequence[str], delta: float, ttl_s: float = 86400) -> None:
        if not delta:
            return
        with self._idle:
            self._num_queued += 1
            if self._worker is None:
                self._worker = threading.Thread(target=self._settle_forever, name="tokenops-budget-settle", daemon=True)
                self._worker.start()
        self._settlements.put((list(keys), delta, int(max(60, ttl_s))))

    def _settle_forever(self) -> None:
        while True:
            batch = [self._settlements.get()]
            while not self._settlements.empty() and len(batch) < 256:
                batch.append(self._settlements.get())
            pipe = self.client.pipeline(transaction=False)
            for keys, delta, ttl in batch:
                for k in keys:
                    pipe.incrbyfloat(k, delta)
                    pipe.expire(k, ttl)
            try:
                pipe.execute()
            except Exception as e:  # the estimates stay charged: too strict, never too lenient
                log.warning("budget settlement of %d request(s) failed: %s", len(batch), e)
            with self._idle:
                self._num_queued -= len(batch)
                self._idle.notify_all()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued settlement reached Redis; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._num_queued == 0, timeout=timeout_s)

    def committed(self, keys: Sequence[str], flush: bool = True) -> list[float]:
        if not keys:
            return []
        if flush:
            self.flush()
        return [float(v) if v is not None else 0.0 for v in self.client.mget(list(keys))]

    def seed(self, key: str, value: float, ttl_s: float = 86400) -> None:
        self.client.set(key, repr(float(value)), nx=True, ex=int(max(60, ttl_s)))
