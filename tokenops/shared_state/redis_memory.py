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

A turn is a read-modify-write of its session (:class:`~tokenops.shared_state.write_behind.WatchedKey`):
``WATCH`` and ``GET`` sent together on the request's path, then, on a write-behind thread while the
request goes on, ``MULTI``, the session's ``SET``, the bookkeeping script and ``EXEC``, which Redis
refuses when another replica wrote the session meanwhile (optimistic locking; the turn is then
merged into the newer value): two replicas storing turns of one session at the same time retry
instead of losing one. The write lands about a millisecond after :meth:`RedisSessionMemory.remember`
returns, long before the answer does; a later turn of the session on this replica, and the admin
views, wait for it (``flush``). A gateway killed -9 in that millisecond loses that turn's memory.
Same semantics as the embedded default,
checked by one scenario run against both (tests/shared_state/test_memory_conformance.py).
Not for Redis Cluster (the script touches keys it is not handed). When Redis does not answer, a
turn goes on without memory (nothing remembered or recalled; logged and counted), as a request
without a session does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tokenops.memory.memory_store import MemoryEntry, RecentVectors, evict_to_budget, near_duplicate, split_chunks
from tokenops.shared_state.session_copies import SessionCopies
from tokenops.shared_state.session_layout import _BOOKKEEP, _member, _names, decode_entries, encode_entries
from tokenops.shared_state.write_behind import WatchedKey, WriteBehind

log = logging.getLogger(__name__)


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
        self._embed = RecentVectors(embed)
        self.num_unavailable = 0  # turns served without memory because Redis did not answer
        self._writes = WriteBehind("session-memory-write")
        self._copies = SessionCopies(client, f"{prefix}:mem:changed")

    def _blob_key(self, member: str) -> str:
        return f"{self._p}s:{member}"

    def _version_key(self, member: str) -> str:
        """How many times the session was written (bumped in each write's ``MULTI``)."""
        return f"{self._p}v:{member}"

    # -- formation and evolution -----------------------------------------------------

    def remember(self, tenant: str, session: str, turns: list[tuple[str, str]]) -> int:
        """Store ``(role, text)`` turns; returns how many new entries were made. On the caller's
        path: nothing sent when this replica holds a live copy of the session
        (:mod:`tokenops.shared_state.session_copies`), else one round trip (``WATCH`` + ``GET``).
        The write (``MULTI`` ... ``EXEC``, refused if another replica wrote the session meanwhile,
        then done again from a fresh read) runs on the write-behind thread while the request goes
        on; a later turn of the same session on this replica waits for it first."""
        import redis

        chunks = list(dict.fromkeys((r, piece) for r, text in turns for piece in split_chunks(text, self.chunk_chars)))
        member = _member(tenant, session)
        self._writes.wait_key(member)
        now, seq = self.clock(), self._copies.seq
        copy = self._copies.get(member)
        if copy is not None:
            base, stored = copy
            change = self._merge(stored, chunks, now)
            if change is None:
                return 0
            mine, num_mine, my_counts = change
            self._copies.put(member, mine, seq, -1)  # its version: when the write lands
            self._writes.submit(member, lambda: self._finish(base, member, chunks, mine, now, my_counts))
            return num_mine
        txn = None
        try:
            txn = WatchedKey(self.client, self._blob_key(member))
            change = self._merge(decode_entries(txn.read()[0]), chunks, now)
            if change is None:
                txn.close()
                return 0
            entries, num_new, counts = change
            self._copies.put(member, entries, seq, -1)  # its version: when the write lands
            self._writes.submit(member, lambda: self._finish(txn, member, chunks, entries, now, counts))
            return num_new
        except redis.RedisError as e:  # Redis away: the request goes on without memory
            if txn is not None:
                txn.close(failed=True)
            self._unavailable(e)
            return 0

    def _finish(
        self,
        read: WatchedKey | int,
        member: str,
        chunks: list[tuple[str, str]],
        entries: list[MemoryEntry],
        now: float,
        counts: tuple[int, int, int],
    ) -> None:
        """The write-behind half of :meth:`remember`. ``read``: the transaction whose read it
        merged, or the version of this replica's copy it merged: written as merged if the session
        is still at that version (``WATCH`` + a ``GET`` of the version, not of the value)."""
        import redis

        try:
            txn = read if isinstance(read, WatchedKey) else WatchedKey(self.client, self._blob_key(member))
            with txn:
                done = isinstance(read, WatchedKey) or int(txn.read(self._version_key(member))[0] or 0) == read
                replies = txn.commit(self._write(member, entries, now, counts)) if done else None
            if replies is not None:
                self._copies.set_version(member, int(replies[-1]))
            done = replies is not None
            while not done:  # another replica wrote the session after our read: merge into theirs
                done = self._update(member, chunks, now) is not None
        except redis.RedisError as e:
            self._copies.drop(member)  # it holds a turn Redis does not
            self._unavailable(e)

    def _unavailable(self, error: Exception) -> None:
        self.num_unavailable += 1
        if self.num_unavailable in (1, 10, 100) or self.num_unavailable % 1000 == 0:
            log.warning(
                "session memory: Redis unavailable (%s); %d turns served without it", error, self.num_unavailable
            )

    def _merge(
        self, stored: list[MemoryEntry], chunks: list[tuple[str, str]], now: float
    ) -> tuple[list[MemoryEntry], int, tuple[int, int, int]] | None:
        """The session's ``stored`` entries (changed in place) with ``chunks`` added: (entries,
        new, (merged, expired, evicted)), or None when there is nothing to write."""
        entries, num_expired = self._live(stored, now)
        known = {(e.role, e.text): e for e in entries}
        fresh = [c for c in chunks if c not in known]
        for c in chunks:
            if c in known:
                entry = known[c]
                entry.last_seen, entry.num_seen = now, entry.num_seen + 1
        if not fresh and not entries:
            return None
        num_new, num_merged = self._add(entries, fresh, now)
        return entries, num_new, (num_merged, num_expired, self._fit_budget(entries))

    def _update(self, member: str, chunks: list[tuple[str, str]], now: float) -> int | None:
        """One read-modify-write of the session, both round trips here; None when another replica
        won the race."""
        seq = self._copies.seq
        with WatchedKey(self.client, self._blob_key(member)) as txn:
            change = self._merge(decode_entries(txn.read()[0]), chunks, now)
            if change is None:
                return 0
            entries, num_new, counts = change
            replies = txn.commit(self._write(member, entries, now, counts))
            if replies is None:
                return None
        self._copies.put(member, entries, seq, int(replies[-1]))
        return num_new

    def _add(self, entries: list[MemoryEntry], fresh: list[tuple[str, str]], now: float) -> tuple[int, int]:
        """Append the ``fresh`` chunks to ``entries``, a near-duplicate merged into its twin;
        returns (new, merged)."""
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
        return num_new, num_merged

    def _write(
        self, member: str, entries: list[MemoryEntry], now: float, counts: tuple[int, int, int] = (0, 0, 0)
    ) -> list[tuple[Any, ...]]:
        """The commands that store ``entries`` as the session (none: delete it) and keep the
        budgets (the last reply: the session's new version, 0 when deleted)."""
        p, key = self._p, self._blob_key(member)
        size = sum(e.num_bytes for e in entries)
        ttl_ms, version = max(1, int(self.ttl_s * 1000)), self._version_key(member)
        store: tuple[Any, ...] = ("DEL", key, version)
        if entries:
            store = ("SET", key, encode_entries(entries), "PX", ttl_ms)
        args = [member, size, now, now - self.ttl_s, self.max_total_bytes, self.max_sessions, f"{p}s:", *counts]
        keys = (f"{p}lru", f"{p}bytes", f"{p}total", f"{p}stats", f"{p}versions", version)
        script = ("EVAL", _BOOKKEEP, len(keys), *keys, *args, self._copies.channel, f"{p}v:", ttl_ms)
        return [store, self._copies.message(member), script]

    def _near_duplicate(
        self, entries: list[MemoryEntry], role: str, text: str, vector: np.ndarray
    ) -> MemoryEntry | None:
        return near_duplicate(entries, role, vector, self.merge_threshold)

    def _fit_budget(self, entries: list[MemoryEntry]) -> int:
        return evict_to_budget(entries, self.max_session_bytes)

    def _live(self, entries: list[MemoryEntry], now: float) -> tuple[list[MemoryEntry], int]:
        alive = [e for e in entries if now - e.last_seen <= self.ttl_s]
        return alive, len(entries) - len(alive)

    def _read(self, tenant: str, session: str) -> tuple[int, list[MemoryEntry]]:
        """(version, live entries) of the session, read at once."""
        member = _member(tenant, session)
        blob, version = self.client.mget([self._blob_key(member), self._version_key(member)])
        return int(version or 0), self._live(decode_entries(blob), self.clock())[0]

    # -- retrieval ---------------------------------------------------------------------

    def recall(self, tenant: str, session: str, query: str) -> list[tuple[float, MemoryEntry]]:
        """The session's entries, most similar to ``query`` first."""
        import redis

        vector = self._embed([query])[0]
        member = _member(tenant, session)
        try:
            copy = self._copies.get(member)  # as this replica last wrote or read it, if still true
            if copy is None:
                self._writes.wait_key(member)  # this replica's writes of the session first
                seq = self._copies.seq
                copy = self._read(tenant, session)
                self._copies.put(member, copy[1], seq, copy[0])
            entries = self._live(copy[1], self.clock())[0]
        except redis.RedisError as e:
            self._unavailable(e)
            return []
        scored = [(float(e.vector @ vector), e) for e in entries]
        scored.sort(key=lambda x: (-x[0], x[1].id))
        return scored

    # -- admin -------------------------------------------------------------------------

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until this replica's queued writes reached Redis; False on timeout."""
        return self._writes.flush(timeout_s)

    def close(self) -> None:
        """Land the queued writes and stop listening for other replicas' writes."""
        self.flush()
        self._copies.close()

    def _members(self, tenant: str | None) -> list[str]:
        self.flush()
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
        self.flush()  # this replica's writes first (one of them may have dropped this session)
        entries = self._read(tenant, session)[1]
        return [e.view() for e in sorted(entries, key=lambda e: e.id)] if entries else None

    def delete_session(self, tenant: str, session: str) -> int:
        member = _member(tenant, session)
        self._writes.wait_key(member)
        self._copies.drop(member)
        while True:
            with WatchedKey(self.client, self._blob_key(member)) as txn:
                blob = txn.read()[0]
                if txn.commit(self._write(member, [], self.clock())) is not None:
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
