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
- ``P:mem:ids`` (entry ids) and ``P:mem:stats`` (merged / expired / evicted counters).

A turn is a read-modify-write of its session under ``WATCH``: two replicas storing turns of one
session at the same time retry instead of losing one. Same semantics as the embedded default,
checked by one scenario run against both (tests/shared_state/test_memory_conformance.py).
Not for Redis Cluster (the script touches keys it is not handed).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from tokenops.memory.memory_store import MemoryEntry, split_chunks

#: Drops expired sessions, then least recently used ones while over either budget; keeps the
#: per-session byte hash and the total in step. KEYS: lru, sizes, total, stats.
#: ARGV: member, size, now, expire_before, max_total, max_sessions, blob key prefix.
_ACCOUNT = """
local member, size, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local old = tonumber(redis.call('HGET', KEYS[2], member) or '0')
if size > 0 then
  redis.call('HSET', KEYS[2], member, size)
  redis.call('ZADD', KEYS[1], now, member)
else
  redis.call('HDEL', KEYS[2], member)
  redis.call('ZREM', KEYS[1], member)
end
redis.call('INCRBY', KEYS[3], size - old)
local function drop(m)
  local s = tonumber(redis.call('HGET', KEYS[2], m) or '0')
  redis.call('DEL', ARGV[7] .. m)
  redis.call('HDEL', KEYS[2], m)
  redis.call('ZREM', KEYS[1], m)
  redis.call('INCRBY', KEYS[3], -s)
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4])) do
  drop(m)
end
local evicted = 0
while redis.call('ZCARD', KEYS[1]) > 1 and (tonumber(redis.call('GET', KEYS[3]) or '0') > tonumber(ARGV[5])
    or redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[6])) do
  drop(redis.call('ZRANGE', KEYS[1], 0, 0)[1])
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
    meta = [[e.id, e.role, e.text, e.created_at, e.last_seen, e.num_seen] for e in entries]
    vectors = b"".join(np.asarray(e.vector, dtype=np.float32).tobytes() for e in entries)
    return json.dumps(meta, separators=(",", ":")).encode() + b"\x00" + vectors


def decode_entries(blob: bytes | None) -> list[MemoryEntry]:
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
        self._account = client.register_script(_ACCOUNT)
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()  # text -> vector, newest last

    def _blob_key(self, member: str) -> str:
        return f"{self._p}s:{member}"

    # -- formation and evolution -----------------------------------------------------

    def remember(self, tenant: str, session: str, turns: list[tuple[str, str]]) -> int:
        """Store ``(role, text)`` turns; returns how many new entries were made."""
        import redis

        chunks = list(dict.fromkeys((r, piece) for r, text in turns for piece in split_chunks(text, self.chunk_chars)))
        member = _member(tenant, session)
        key = self._blob_key(member)
        while True:
            with self.client.pipeline() as pipe:
                try:
                    pipe.watch(key)
                    return self._update(pipe, member, key, chunks)
                except redis.WatchError:
                    continue  # another replica wrote this session meanwhile: read it again

    def _update(self, pipe: Any, member: str, key: str, chunks: list[tuple[str, str]]) -> int:
        now = self.clock()
        entries, num_expired = self._live(decode_entries(pipe.get(key)), now)
        known = {(e.role, e.text): e for e in entries}
        fresh = [c for c in chunks if c not in known]
        for c in chunks:
            if c in known:
                entry = known[c]
                entry.last_seen, entry.num_seen = now, entry.num_seen + 1
        if not fresh and not entries:
            pipe.unwatch()
            return 0
        vectors = self._embed([text for _, text in fresh]) if fresh else []
        num_new = num_merged = 0
        for (role, text), vector in zip(fresh, vectors):
            twin = self._near_duplicate(entries, role, text, vector)
            if twin is not None:
                if len(text) > len(twin.text):
                    twin.text, twin.vector = text, vector
                twin.last_seen, twin.num_seen = now, twin.num_seen + 1
                num_merged += 1
                continue
            entries.append(MemoryEntry(0, role, text, vector, now, now))
            num_new += 1
        num_evicted = self._fit_budget(entries)
        if num_new:
            last = int(pipe.execute_command("INCRBY", f"{self._p}ids", num_new))
            ids = iter(range(last - num_new + 1, last + 1))
            for e in entries:
                if e.id == 0:
                    e.id = next(ids)
        size = sum(e.num_bytes for e in entries)
        pipe.multi()
        if entries:
            pipe.set(key, encode_entries(entries), px=max(1, int(self.ttl_s * 1000)))
        else:
            pipe.delete(key)
        self._account_call(pipe, member, size, now)
        stats = f"{self._p}stats"
        for name, n in (("merged", num_merged), ("expired", num_expired), ("evicted", num_evicted)):
            if n:
                pipe.hincrby(stats, name, n)
        pipe.execute()
        return num_new

    def _account_call(self, pipe: Any, member: str, size: int, now: float) -> None:
        self._account(
            keys=[f"{self._p}lru", f"{self._p}bytes", f"{self._p}total", f"{self._p}stats"],
            args=[member, size, now, now - self.ttl_s, self.max_total_bytes, self.max_sessions, f"{self._p}s:"],
            client=pipe,
        )

    def _embed(self, texts: list[str]) -> np.ndarray:
        """``embed`` with the last few texts' vectors kept (remember() then recall() of the same
        last message embeds it once)."""
        found = {t: self._recent[t] for t in texts if t in self._recent}
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            found.update(zip(missing, self.embed(missing)))
            for text in missing:
                self._recent[text] = found[text]
            while len(self._recent) > 64:
                self._recent.popitem(last=False)
        return np.stack([found[t] for t in texts])

    def _near_duplicate(
        self, entries: list[MemoryEntry], role: str, text: str, vector: np.ndarray
    ) -> MemoryEntry | None:
        best, best_score = None, self.merge_threshold
        for e in entries:
            if e.role == role:
                score = float(e.vector @ vector)
                if score >= best_score:
                    best, best_score = e, score
        return best

    def _fit_budget(self, entries: list[MemoryEntry]) -> int:
        total = sum(e.num_bytes for e in entries)
        num_evicted = 0
        for e in sorted(entries, key=lambda e: (e.last_seen, e.id)):
            if total <= self.max_session_bytes:
                break
            entries.remove(e)
            total -= e.num_bytes
            num_evicted += 1
        return num_evicted

    def _live(self, entries: list[MemoryEntry], now: float) -> tuple[list[MemoryEntry], int]:
        alive = [e for e in entries if now - e.last_seen <= self.ttl_s]
        return alive, len(entries) - len(alive)

    def _read(self, tenant: str, session: str) -> list[MemoryEntry]:
        return self._live(decode_entries(self.client.get(self._blob_key(_member(tenant, session)))), self.clock())[0]

    # -- retrieval ---------------------------------------------------------------------

    def recall(self, tenant: str, session: str, query: str) -> list[tuple[float, MemoryEntry]]:
        """The session's entries, most similar to ``query`` first."""
        vector = self._embed([query])[0]
        scored = [(float(e.vector @ vector), e) for e in self._read(tenant, session)]
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
            entries = self._live(decode_entries(blob), now)[0]
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
        key = self._blob_key(member)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.delete(key)
            self._account_call(pipe, member, 0, self.clock())
            blob = pipe.execute()[0]
        return len(decode_entries(blob))

    def delete_tenant(self, tenant: str) -> int:
        return sum(self.delete_session(*_names(m)) for m in self._members(tenant))

    def stats(self) -> dict[str, int]:
        members = self._members(None)
        blobs = self.client.mget([self._blob_key(m) for m in members]) if members else []
        counters = {k.decode(): int(v) for k, v in self.client.hgetall(f"{self._p}stats").items()}
        return {
            "sessions": sum(1 for b in blobs if b),
            "entries": sum(len(decode_entries(b)) for b in blobs),
            "bytes": int(self.client.get(f"{self._p}total") or 0),
            "merged": counters.get("merged", 0),
            "expired": counters.get("expired", 0),
            "evicted": counters.get("evicted", 0),
        }
