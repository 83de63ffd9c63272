"""Session memory in Redis: every gateway replica of a service remembers and recalls the same
sessions (``[shared] redis_url``; the embedded default is :class:`tokenops.memory.memory_store.SessionMemory`).

Why Redis and not PostgreSQL: session memory is hot, short-lived state read on every turn of a
session, with a TTL and byte bounds and nothing relational about it; Redis expires keys itself and
answers on loopback in tens of microseconds, where a SQL transaction costs a millisecond or more.

Layout (``P`` is the key prefix; a session is ``tenant.hex():session.hex()``, so no name can
collide with another or reach into another tenant's keys):

- ``P:mem:s:<session>``: the session's entries in one value, metadata as JSON, a NUL, then the
  float32 vectors; it expires ``ttl_s`` after its newest entry was last seen;
- ``P:mem:lru`` (sorted set, score = last use), ``P:mem:bytes`` (hash, bytes per session) and
  ``P:mem:total``: the process-wide budgets of the embedded default, kept across replicas by one
  Lua script that also drops expired and least recently used sessions;
- ``P:mem:stats`` (merged / expired / evicted counters).

A turn is a read-modify-write of its session in two round trips: ``GET``, then one script that
writes only if the session's version is still the one read (compare-and-set; the value starts
with ``<version>:``): two replicas storing turns of one session at the same time retry instead of
losing one. Same semantics as the embedded default,
checked by one scenario run against both (tests/shared_state/test_memory_conformance.py).
Not for Redis Cluster (the script touches keys it is not handed). When Redis does not answer, a
turn goes on without memory (nothing remembered or recalled; logged and counted), as a request
without a session does.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tokenops.memory.memory_store import MemoryEntry, RecentVectors, evict_to_budget, near_duplicate, split_chunks

log = logging.getLogger(__name__)

#: One write of a session, atomic: compare its version with the one read (-1: another replica wrote
#: it meanwhile, read again), store the new value (or delete it), keep the per-session byte hash and
#: the total in step, count merges and evictions, drop expired sessions, then least recently used
#: ones while over either budget. KEYS: the session, lru, sizes, total, stats. ARGV: version read,
#: new value, its lifetime ms, member, size, now, expire before, max total bytes, max sessions, the
#: session keys' prefix, merged, expired, evicted.
_WRITE = """
local cur = redis.call('GET', KEYS[1])
local version = 0
if cur then version = tonumber(string.match(cur, '^(%d+):')) or 0 end
if version ~= tonumber(ARGV[1]) then return -1 end
local member, size, now = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
if size > 0 then
  redis.call('SET', KEYS[1], (version + 1) .. ':' .. ARGV[2], 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
local old = tonumber(redis.call('HGET', KEYS[3], member) or '0')
if size > 0 then
  redis.call('HSET', KEYS[3], member, size)
  redis.call('ZADD', KEYS[2], now, member)
else
  redis.call('HDEL', KEYS[3], member)
  redis.call('ZREM', KEYS[2], member)
end
redis.call('INCRBY', KEYS[4], size - old)
for i, name in ipairs({'merged', 'expired', 'evicted'}) do
  if tonumber(ARGV[10 + i]) > 0 then redis.call('HINCRBY', KEYS[5], name, ARGV[10 + i]) end
end
local function drop(m)
  local s = tonumber(redis.call('HGET', KEYS[3], m) or '0')
  redis.call('DEL', ARGV[10] .. m)
  redis.call('HDEL', KEYS[3], m)
  redis.call('ZREM', KEYS[2], m)
  redis.call('INCRBY', KEYS[4], -s)
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[7])) do
  drop(m)
end
local evicted = 0
while redis.call('ZCARD', KEYS[2]) > 1 and (tonumber(redis.call('GET', KEYS[4]) or '0') > tonumber(ARGV[8])
    or redis.call('ZCARD', KEYS[2]) > tonumber(ARGV[9])) do
  drop(redis.call('ZRANGE', KEYS[2], 0, 0)[1])
  evicted = evicted + 1
end
return evicted
"""


def _member(tenant: str, session: str) -> str:
    return f"{tenant.encode().hex()}:{session.encode().hex()}"


def _names(member: str) -> tuple[str, str]:
    tenant, session = member.split(":")
    return bytes.fromhex(tenant).decode(), bytes.fromhex(session).decode()


def encode_entries(entries: list[MemoryEntry]) -> bytes:
    """The stored value less its ``<version>:`` prefix (the write script adds it)."""
    meta = [[e.id, e.role, e.text, e.created_at, e.last_seen, e.num_seen] for e in entries]
    vectors = b"".join(np.asarray(e.vector, dtype=np.float32).tobytes() for e in entries)
    return json.dumps(meta, separators=(",", ":")).encode() + b"\x00" + vectors


def split_version(blob: bytes | None) -> tuple[int, bytes]:
    """``(version, rest)`` of a stored value (0 and nothing when there is none)."""
    if not blob:
        return 0, b""
    version, _, rest = blob.partition(b":")
    return int(version), rest


def decode_entries(blob: bytes | None) -> list[MemoryEntry]:
    """The entries of a value as :func:`encode_entries` made it (no version prefix)."""
    if not blob:
        return []
    meta_bytes, _, vector_bytes = blob.partition(b"\x00")
    meta = json.loads(meta_bytes)
    if not meta:
        return []
    vectors = np.frombuffer(vector_bytes, dtype=np.float32).reshape(len(meta), -1)
    return [
        MemoryEntry(int(i), role, text, vectors[n].copy(), created, seen, int(num))
        for n, (i, role, text, created, seen, num) in enumerate(meta)
    ]


class RedisSessionMemory:
    """The interface of :class:`~tokenops.memory.memory_store.SessionMemory`, kept in Redis."""

    def __init__(
        self,
        embed: Callable[[list[str]], np.ndarray],
        client: Any,
        *,
        prefix: str = "tokenops",
        ttl_s: float = 3600.0,
        max_session_bytes: int = 1 << 20,
        max_sessions: int = 10_000,
        chunk_chars: int = 400,
        merge_threshold: float = 0.97,
        clock: Callable[[], float] = time.time,
        max_total_bytes: int = 256 << 20,
    ) -> None:
        assert ttl_s > 0 and max_session_bytes > 0 and max_sessions > 0 and chunk_chars > 0 and max_total_bytes > 0
        self.embed = embed
        self.client = client
        self.ttl_s = ttl_s
        self.max_session_bytes = max_session_bytes
        self.max_sessions = max_sessions
        self.max_total_bytes = max_total_bytes
        self.chunk_chars = chunk_chars
        self.merge_threshold = merge_threshold
        self.clock = clock
        self._p = f"{prefix}:mem:"
        self._script = client.register_script(_WRITE)
        self._embed = RecentVectors(embed)
        self.num_unavailable = 0  # turns served without memory because Redis did not answer
        self._written: dict[str, tuple[float, list[MemoryEntry]]] = {}  # member -> (when, entries)
        self._lock = threading.Lock()

    def _blob_key(self, member: str) -> str:
        return f"{self._p}s:{member}"

    # -- formation and evolution -----------------------------------------------------

    def remember(self, tenant: str, session: str, turns: list[tuple[str, str]]) -> int:
        """Store ``(role, text)`` turns; returns how many new entries were made. Two round trips:
        read the session, write it back if no other replica wrote it meanwhile (else again)."""
        import redis

        chunks = list(dict.fromkeys((r, piece) for r, text in turns for piece in split_chunks(text, self.chunk_chars)))
        member = _member(tenant, session)
        try:
            while True:
                num_new = self._update(member, chunks)
                if num_new is not None:
                    return num_new
        except redis.RedisError as e:  # Redis away: the request goes on without memory
            self._unavailable(e)
            return 0

    def _unavailable(self, error: Exception) -> None:
        self.num_unavailable += 1
        if self.num_unavailable in (1, 10, 100) or self.num_unavailable % 1000 == 0:
            log.warning(
                "session memory: Redis unavailable (%s); %d turns served without it", error, self.num_unavailable
            )

    def _update(self, member: str, chunks: list[tuple[str, str]]) -> int | None:
        """One read-modify-write of the session; None when another replica won the race."""
        now = self.clock()
        version, blob = split_version(self.client.get(self._blob_key(member)))
        entries, num_expired = self._live(decode_entries(blob), now)
        known = {(e.role, e.text): e for e in entries}
        fresh = [c for c in chunks if c not in known]
        for c in chunks:
            if c in known:
                entry = known[c]
                entry.last_seen, entry.num_seen = now, entry.num_seen + 1
        if not fresh and not entries:
            return 0
        vectors: Any = self._embed([text for _, text in fresh]) if fresh else []
        num_new = num_merged = 0
        next_id = max((e.id for e in entries), default=0) + 1  # ids order a session's entries
        for (role, text), vector in zip(fresh, vectors):
            twin = self._near_duplicate(entries, role, text, vector)
            if twin is not None:
                if len(text) > len(twin.text):
                    twin.text, twin.vector = text, vector
                twin.last_seen, twin.num_seen = now, twin.num_seen + 1
                num_merged += 1
                continue
            entries.append(MemoryEntry(next_id, role, text, vector, now, now))
            next_id += 1
            num_new += 1
        num_evicted = self._fit_budget(entries)
        counts = (num_merged, num_expired, num_evicted)
        if self._write(member, version, entries, now, counts) < 0:
            return None
        with self._lock:  # what the turn's recall reads, if it comes at once (a round trip saved)
            self._written[member] = (time.monotonic(), list(entries))
            while len(self._written) > 256:
                self._written.pop(next(iter(self._written)))
        return num_new

    def _write(self, member: str, version: int, entries: list[MemoryEntry], now: float, counts=(0, 0, 0)) -> int:
        """Store ``entries`` as the session (none: delete it) if it is still at ``version``; -1
        when it is not, else how many sessions the budgets dropped."""
        p = self._p
        size = sum(e.num_bytes for e in entries)
        value = encode_entries(entries) if entries else b""
        args = [version, value, max(1, int(self.ttl_s * 1000)), member, size, now, now - self.ttl_s]
        args += [self.max_total_bytes, self.max_sessions, f"{p}s:", *counts]
        keys = [self._blob_key(member), f"{p}lru", f"{p}bytes", f"{p}total", f"{p}stats"]
        return int(self._script(keys=keys, args=args))

    def _near_duplicate(
        self, entries: list[MemoryEntry], role: str, text: str, vector: np.ndarray
    ) -> MemoryEntry | None:
        return near_duplicate(entries, role, vector, self.merge_threshold)

    def _fit_budget(self, entries: list[MemoryEntry]) -> int:
        return evict_to_budget(entries, self.max_session_bytes)

    def _live(self, entries: list[MemoryEntry], now: float) -> tuple[list[MemoryEntry], int]:
        alive = [e for e in entries if now - e.last_seen <= self.ttl_s]
        return alive, len(entries) - len(alive)

    def _just_written(self, member: str) -> list[MemoryEntry] | None:
        """The session as this replica wrote it under a second ago (the remember() of the same
        turn), else None: read it from Redis."""
        with self._lock:
            written = self._written.get(member)
        if written is None or time.monotonic() - written[0] > 1.0:
            return None
        return self._live(written[1], self.clock())[0]

    def _read(self, tenant: str, session: str) -> list[MemoryEntry]:
        blob = split_version(self.client.get(self._blob_key(_member(tenant, session))))[1]
        return self._live(decode_entries(blob), self.clock())[0]

    # -- retrieval ---------------------------------------------------------------------

    def recall(self, tenant: str, session: str, query: str) -> list[tuple[float, MemoryEntry]]:
        """The session's entries, most similar to ``query`` first."""
        import redis

        vector = self._embed([query])[0]
        try:
            entries = self._just_written(_member(tenant, session)) or self._read(tenant, session)
        except redis.RedisError as e:
            self._unavailable(e)
            return []
        scored = [(float(e.vector @ vector), e) for e in entries]
        scored.sort(key=lambda x: (-x[0], x[1].id))
        return scored

    # -- admin -------------------------------------------------------------------------

    def _members(self, tenant: str | None) -> list[str]:
        members = [m.decode() for m in self.client.zrange(f"{self._p}lru", 0, -1)]
        if tenant is None:
            return members
        mine = tenant.encode().hex() + ":"
        return [m for m in members if m.startswith(mine)]

    def sessions(self, tenant: str | None = None) -> list[dict[str, Any]]:
        members = self._members(tenant)
        blobs = self.client.mget([self._blob_key(m) for m in members]) if members else []
        now = self.clock()
        out = []
        for member, blob in zip(members, blobs):
            entries = self._live(decode_entries(split_version(blob)[1]), now)[0]
            if entries:
                name_tenant, name_session = _names(member)
                out.append(
                    {
                        "tenant": name_tenant,
                        "session": name_session,
                        "entries": len(entries),
                        "bytes": sum(e.num_bytes for e in entries),
                        "last_seen": max(e.last_seen for e in entries),
                    }
                )
        return out

    def entries(self, tenant: str, session: str) -> list[dict[str, Any]] | None:
        entries = self._read(tenant, session)
        return [e.view() for e in sorted(entries, key=lambda e: e.id)] if entries else None

    def delete_session(self, tenant: str, session: str) -> int:
        member = _member(tenant, session)
        with self._lock:
            self._written.pop(member, None)
        while True:
            version, blob = split_version(self.client.get(self._blob_key(member)))
            if self._write(member, version, [], self.clock()) >= 0:
                return len(decode_entries(blob))

    def delete_tenant(self, tenant: str) -> int:
        return sum(self.delete_session(*_names(m)) for m in self._members(tenant))

    def stats(self) -> dict[str, int]:
        members = self._members(None)
        blobs = self.client.mget([self._blob_key(m) for m in members]) if members else []
        counters = {k.decode(): int(v) for k, v in self.client.hgetall(f"{self._p}stats").items()}
        return {
            "sessions": sum(1 for b in blobs if b),
            "entries": sum(len(decode_entries(split_version(b)[1])) for b in blobs),
            "bytes": int(self.client.get(f"{self._p}total") or 0),
            "merged": counters.get("merged", 0),
            "expired": counters.get("expired", 0),
            "evicted": counters.get("evicted", 0),
        }
