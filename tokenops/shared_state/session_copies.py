"""This replica's copies of the sessions it last read or wrote, kept true by Redis pub/sub.

A turn of a session that this replica served last (a balancer hashing on the session, or one
gateway) needs no read of Redis on its path: :class:`SessionCopies` holds the session as this
replica last saw it and drops it when any other replica writes it. Every write of a session
(:mod:`tokenops.shared_state.redis_memory`) publishes ``<origin>:<member>`` on one channel in the
same ``MULTI`` as the write, and the budgets script publishes each session it drops; a subscriber
thread here drops the copies other replicas announce.

A copy is used only while the subscription is up: when it breaks (Redis away, a timeout) every
copy is dropped and none is kept until the subscriber is back, so a message missed meanwhile
cannot leave a stale copy behind. A copy taken from a read is kept only if no invalidation
arrived while the read was on its way (:attr:`seq`). What stays open: a write another replica
makes is seen here when its message arrives (well under a millisecond on loopback), not at the
instant of its ``EXEC``; the write itself is never lost (writes are ``WATCH``-guarded).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
import weakref
from collections import OrderedDict
from typing import Any

from tokenops.memory.memory_store import MemoryEntry

log = logging.getLogger(__name__)


class SessionCopies:
    """Copies of sessions (``member`` -> entries), bounded by count and bytes."""

    def __init__(self, client: Any, channel: str, max_sessions: int = 1024, max_bytes: int = 64 << 20) -> None:
        self.client = client
        self.channel = channel
        self.origin = uuid.uuid4().hex
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.seq = 0  # invalidations from other replicas applied so far (and resubscriptions)
        self._copies: OrderedDict[str, tuple[int, int, list[MemoryEntry]]] = OrderedDict()  # size, version
        self._bytes = 0
        self._lock = threading.Lock()
        self._live = threading.Event()  # subscribed: copies may be used
        self._stop = threading.Event()
        # the thread holds this object weakly: a memory replaced by a reconfiguration stops it
        self._thread = threading.Thread(
            target=_listen, args=(weakref.ref(self), self._stop), name="session-memory-invalidate", daemon=True
        )
        self._thread.start()

    def message(self, member: str) -> tuple[str, str, str]:
        """The ``PUBLISH`` that tells the other replicas this replica wrote ``member``."""
        return ("PUBLISH", self.channel, f"{self.origin}:{member}")

    def get(self, member: str) -> tuple[int, list[MemoryEntry]] | None:
        """(the session's version in Redis, entries this caller may change: the copy's own stay as
        they are), or None."""
        if not self._live.is_set():
            return None
        with self._lock:
            found = self._copies.get(member)
            if found is None:
                return None
            self._copies.move_to_end(member)
        return found[1], [dataclasses.replace(e) for e in found[2]]

    def put(self, member: str, entries: list[MemoryEntry], seq: int, version: int) -> None:
        """Keep ``entries`` (a copy of the list) as ``member`` at ``version``, if no invalidation
        arrived since :attr:`seq` was ``seq`` (read before the entries were)."""
        if not self._live.is_set():
            return
        size = sum(e.num_bytes for e in entries)
        with self._lock:
            if seq != self.seq:
                return
            self._drop(member)
            self._copies[member] = (size, version, [dataclasses.replace(e) for e in entries])
            self._bytes += size
            while self._copies and (len(self._copies) > self.max_sessions or self._bytes > self.max_bytes):
                self._drop(next(iter(self._copies)))

    def set_version(self, member: str, version: int) -> None:
        """The version Redis gave the write this replica's copy of ``member`` holds."""
        with self._lock:
            found = self._copies.get(member)
            if found is not None:
                self._copies[member] = (found[0], version, found[2])

    def drop(self, member: str) -> None:
        with self._lock:
            self._drop(member)

    def _drop(self, member: str) -> None:
        found = self._copies.pop(member, None)
        if found is not None:
            self._bytes -= found[0]

    def _clear(self) -> None:
        with self._lock:
            self._copies.clear()
            self._bytes = 0
            self.seq += 1

    def close(self) -> None:
        self._stop.set()
        self._live.clear()
        self._thread.join(timeout=5)

    def _apply(self, data: Any) -> None:
        text = data.decode() if isinstance(data, bytes) else str(data)
        origin, _, member = text.partition(":")
        if origin == self.origin:
            return
        with self._lock:
            self._drop(member)
            self.seq += 1

    def wait_live(self, timeout_s: float = 5.0) -> bool:
        """True once the subscription is up (tests)."""
        return self._live.wait(timeout_s)


def _listen(ref: weakref.ref[SessionCopies], stop: threading.Event) -> None:
    """The subscriber: applies other replicas' messages to the copies while they exist."""
    while not stop.is_set():
        copies, pubsub = ref(), None
        if copies is None:
            return
        try:
            pubsub = copies.client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(copies.channel)
            copies._clear()  # what was copied before this subscription may have missed a message
            copies._live.set()
            del copies
            while not stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                copies = ref()
                if copies is None:
                    return
                if message is not None:
                    copies._apply(message.get("data"))
                del copies
        except Exception as e:  # Redis away: no copy is trusted until the subscription is back
            copies = ref()
            if copies is None:
                return
            if copies._live.is_set():
                log.warning("session memory: invalidations lost (%s); reading sessions from Redis", e)
            copies._live.clear()
            copies._clear()
            del copies
            stop.wait(1.0)
        finally:
            if pubsub is not None:
                try:
                    pubsub.close()
                except Exception:  # closing a broken connection: nothing left to do
                    pass
