"""Session memory: what a long conversation keeps (formation, evolution, retrieval).

Per ``(tenant, session)``: each user/assistant turn is split into chunks of at most
``chunk_chars`` characters (at line and sentence ends) and stored with an embedding.
Evolution: a chunk that is already stored (same role and text, as when a client resends
its history every turn) only refreshes the entry; a near-duplicate (cosine >=
``merge_threshold``, same role) is merged into it (the longer text is kept). Entries
expire ``ttl_s`` after they were last seen, and a session over ``max_session_bytes``
(text plus vector) drops its least recently seen entries; and when all sessions together
hold more than ``max_total_bytes`` (the process's budget: 10,000 sessions of 1 MiB would
be 10 GiB), the least recently used sessions go whole. Retrieval ranks entries by
cosine similarity to a query. Sessions of different tenants never meet: every call
names the tenant.

In-process: memory does not survive a restart of ``tokenops serve``; ``[shared] redis_url`` keeps
it in Redis for every gateway replica instead (tokenops/shared_state/redis_memory.py).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(slots=True)
class MemoryEntry:
    id: int
    role: str
    text: str
    vector: np.ndarray
    created_at: float
    last_seen: float
    num_seen: int = 1

    @property
    def num_bytes(self) -> int:
        return len(self.text.encode()) + self.vector.nbytes

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role,
            "text": self.text,
            "created_at": self.created_at,
            "last_seen": self.last_seen,
            "num_seen": self.num_seen,
            "bytes": self.num_bytes,
        }


def split_chunks(text: str, chunk_chars: int) -> list[str]:
    """``text`` cut at line and sentence ends into pieces of at most ``chunk_chars``
    characters (a longer sentence is cut at the limit)."""
    pieces: list[str] = []
    current = ""
    for sentence in (s.strip() for s in _SENTENCE_END.split(text)):
        while len(sentence) > chunk_chars:
            if current:
                pieces.append(current)
                current = ""
            pieces.append(sentence[:chunk_chars])
            sentence = sentence[chunk_chars:].strip()
        if not sentence:
            continue
        if current and len(current) + 1 + len(sentence) > chunk_chars:
            pieces.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}" if current else sentence
    if current:
        pieces.append(current)
    return pieces


class RecentVectors:
    """The last few texts' embeddings (``remember()`` then ``recall()`` of the same last message
    embeds it once); thread-safe. Both session memories, in process and in Redis, keep one."""

    def __init__(self, embed: Callable[[list[str]], np.ndarray], size: int = 64) -> None:
        self.embed = embed
        self.size = size
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()  # text -> vector, newest last
        self._lock = threading.Lock()

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            found = {t: self._recent[t] for t in texts if t in self._recent}
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            found.update(zip(missing, self.embed(missing)))
            with self._lock:
                for text in missing:
                    self._recent[text] = found[text]
                while len(self._recent) > self.size:
                    self._recent.popitem(last=False)
        return np.stack([found[t] for t in texts])


def near_duplicate(entries: list[MemoryEntry], role: str, vector: np.ndarray, threshold: float) -> MemoryEntry | None:
    """The entry of ``role`` most similar to ``vector`` at cosine ``threshold`` or more, else None."""
    best, best_score = None, threshold
    for e in entries:
        if e.role == role:
            score = float(e.vector @ vector)
            if score >= best_score:
                best, best_score = e, score
    return best


def evict_to_budget(entries: list[MemoryEntry], max_bytes: int) -> int:
    """Drop the least recently seen entries until the rest fit ``max_bytes``; how many went."""
    total = sum(e.num_bytes for e in entries)
    num_evicted = 0
    for e in sorted(entries, key=lambda e: (e.last_seen, e.id)):
        if total <= max_bytes:
            break
        entries.remove(e)
        total -= e.num_bytes
        num_evicted += 1
    return num_evicted


class SessionMemory:
    """All sessions' entries; thread-safe (the gateway calls it from worker threads)."""

    def __init__(
        self,
        embed: Callable[[list[str]], np.ndarray],
        *,
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
        self.ttl_s = ttl_s
        self.max_session_bytes = max_session_bytes
        self.max_sessions = max_sessions
        self.max_total_bytes = max_total_bytes
        self._bytes: dict[tuple[str, str], int] = {}  # per session, kept with its entries
        self.num_bytes = 0
        self.chunk_chars = chunk_chars
        self.merge_threshold = merge_threshold
        self.clock = clock
        self._sessions: OrderedDict[tuple[str, str], list[MemoryEntry]] = OrderedDict()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._embed = RecentVectors(embed)
        self.num_merged = 0
        self.num_expired = 0
        self.num_evicted = 0

    # -- formation and evolution -----------------------------------------------------

    def remember(self, tenant: str, session: str, turns: list[tuple[str, str]]) -> int:
        """Store ``(role, text)`` turns; returns how many new entries were made."""
        now = self.clock()
        chunks = [(role, piece) for role, text in turns for piece in split_chunks(text, self.chunk_chars)]
        key = (tenant, session)
        with self._lock:
            entries = self._live(key, now)
            known = {(e.role, e.text): e for e in entries}
            fresh = []
            for role, text in dict.fromkeys(chunks):
                entry = known.get((role, text))
                if entry is not None:
                    entry.last_seen, entry.num_seen = now, entry.num_seen + 1
                else:
                    fresh.append((role, text))
        if not fresh:
            return 0
        vectors = self._embed([text for _, text in fresh])  # outside the lock: the model is slow
        num_new = 0
        with self._lock:
            entries = self._sessions.setdefault(key, [])
            self._sessions.move_to_end(key)
            for (role, text), vector in zip(fresh, vectors):
                twin = self._near_duplicate(entries, role, text, vector)
                if twin is not None:
                    if len(text) > len(twin.text):
                        twin.text, twin.vector = text, vector
                    twin.last_seen, twin.num_seen = now, twin.num_seen + 1
                    self.num_merged += 1
                    continue
                entries.append(MemoryEntry(next(self._ids), role, text, vector, now, now))
                num_new += 1
            self._fit_budget(entries)
            self._count(key, entries)
            while len(self._sessions) > self.max_sessions or (
                self.num_bytes > self.max_total_bytes and len(self._sessions) > 1
            ):
                old, _ = self._sessions.popitem(last=False)
                self._count(old, None)
        return num_new

    def _count(self, key: tuple[str, str], entries: list[MemoryEntry] | None) -> None:
        """Keep :attr:`num_bytes` in step with ``key``'s entries (None: it is gone); under the lock."""
        size = sum(e.num_bytes for e in entries) if entries else 0
        self.num_bytes += size - self._bytes.pop(key, 0)
        if size:
            self._bytes[key] = size

    def _near_duplicate(
        self, entries: list[MemoryEntry], role: str, text: str, vector: np.ndarray
    ) -> MemoryEntry | None:
        return near_duplicate(entries, role, vector, self.merge_threshold)

    def _fit_budget(self, entries: list[MemoryEntry]) -> None:
        self.num_evicted += evict_to_budget(entries, self.max_session_bytes)

    def _live(self, key: tuple[str, str], now: float) -> list[MemoryEntry]:
        """The session's entries with the expired ones dropped (call under the lock)."""
        entries = self._sessions.get(key)
        if entries is None:
            return []
        alive = [e for e in entries if now - e.last_seen <= self.ttl_s]
        if len(alive) == len(entries):
            return alive
        self.num_expired += len(entries) - len(alive)
        if not alive:
            del self._sessions[key]
        else:
            entries[:] = alive
        self._count(key, alive)
        return alive

    # -- retrieval ---------------------------------------------------------------------

    def recall(self, tenant: str, session: str, query: str) -> list[tuple[float, MemoryEntry]]:
        """The session's entries, most similar to ``query`` first."""
        vector = self._embed([query])[0]  # usually just embedded by remember(): the last turn
        with self._lock:
            entries = list(self._live((tenant, session), self.clock()))
        scored = [(float(e.vector @ vector), e) for e in entries]
        scored.sort(key=lambda x: (-x[0], x[1].id))
        return scored

    # -- admin -------------------------------------------------------------------------

    def sessions(self, tenant: str | None = None) -> list[dict[str, Any]]:
        now = self.clock()
        with self._lock:
            out = []
            for key in list(self._sessions):
                if tenant is not None and key[0] != tenant:
                    continue
                entries = self._live(key, now)
                if entries:
                    out.append(
                        {
                            "tenant": key[0],
                            "session": key[1],
                            "entries": len(entries),
                            "bytes": sum(e.num_bytes for e in entries),
                            "last_seen": max(e.last_seen for e in entries),
                        }
                    )
            return out

    def entries(self, tenant: str, session: str) -> list[dict[str, Any]] | None:
        with self._lock:
            entries = self._live((tenant, session), self.clock())
            return [e.view() for e in sorted(entries, key=lambda e: e.id)] if entries else None

    def delete_session(self, tenant: str, session: str) -> int:
        with self._lock:
            self._count((tenant, session), None)
            return len(self._sessions.pop((tenant, session), []))

    def delete_tenant(self, tenant: str) -> int:
        with self._lock:
            keys = [k for k in self._sessions if k[0] == tenant]
            for k in keys:
                self._count(k, None)
            return sum(len(self._sessions.pop(k)) for k in keys)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "sessions": len(self._sessions),
                "entries": sum(len(v) for v in self._sessions.values()),
                "bytes": self.num_bytes,
                "merged": self.num_merged,
                "expired": self.num_expired,
                "evicted": self.num_evicted,
            }


class SessionMemoryStore(Protocol):
    """What the plugin and the admin API ask of session memory: :class:`SessionMemory` (this
    process) or :class:`tokenops.shared_state.redis_memory.RedisSessionMemory` (every replica)."""

    ttl_s: float
    max_session_bytes: int

    def remember(self, tenant: str, session: str, turns: list[tuple[str, str]]) -> int: ...
    def recall(self, tenant: str, session: str, query: str) -> list[tuple[float, MemoryEntry]]: ...
    def sessions(self, tenant: str | None = None) -> list[dict[str, Any]]: ...
    def entries(self, tenant: str, session: str) -> list[dict[str, Any]] | None: ...
    def delete_session(self, tenant: str, session: str) -> int: ...
    def delete_tenant(self, tenant: str) -> int: ...
    def stats(self) -> dict[str, int]: ...


class MemorySlot:
    """Where one gateway keeps the session memory its plugin serves from (each gateway owns one)."""

    __slots__ = ("memory",)

    def __init__(self) -> None:
        self.memory: SessionMemoryStore | None = None


#: The slot of the gateway running this code (``Gateway.scope`` sets it); the process's outside any gateway.
slot_in_use: ContextVar[MemorySlot | None] = ContextVar("tokenops_session_memory", default=None)
_PROCESS_SLOT = MemorySlot()


def get_session_memory() -> SessionMemoryStore | None:
    """The memory the session-memory plugin serves from (None when it is off)."""
    return (slot_in_use.get() or _PROCESS_SLOT).memory


def set_session_memory(memory: SessionMemoryStore | None) -> None:
    """Serve from ``memory``; the one it replaces is closed when it can be (Redis session memory
    lands its queued writes and stops listening for other replicas')."""
    slot = slot_in_use.get() or _PROCESS_SLOT
    old, slot.memory = slot.memory, memory
    close = getattr(old, "close", None)
    if old is not None and old is not memory and close is not None:
        close()
