"""The semantic cache across gateway replicas (``[shared] redis_url``): every replica keeps its own
:class:`~tokenops.semcache.cache.SemanticCache` (its own vector index, so a lookup never leaves the
process), and every answer one replica stores is appended to a Redis stream that all replicas read.

- **write**: :meth:`RedisCacheFeed.publish` (the cache's ``on_store``) queues the entry — keys,
  question, the response as JSON, the question's float32 vector, the seconds it has left — and a
  publisher thread appends what has queued with ``XADD`` in one round trip, trimmed to
  ``max_entries`` and to the entries younger than the cache's TTL (no round trip on the request's
  path);
- **read**: a daemon thread blocks on ``XREAD`` from the last id it saw and hands other replicas'
  entries to :meth:`SemanticCache.add_shared` (nothing is embedded again). A replica that starts
  (or restarts after a crash) reads the stream from its start, so it comes up with the service's
  entries, not an empty cache;
- **tenant deletion** travels the same stream: a replica that drops a tenant's answers tells the
  others, in order with the entries.

Why a stream and not pub/sub: a subscriber that reconnects (or starts late) loses what was
published meanwhile; a stream is read from an id, so nothing is missed, and its length is bounded.
Each replica's byte budget (``max_bytes``) holds locally as in one process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time
import uuid
from typing import Any

import numpy as np

from tokenops.semcache.cache import SemanticCache, SharedEntry
from tokenops.types import GatewayResponse

log = logging.getLogger(__name__)


def encode_entry(entry: SharedEntry, expires_at: float | None = None) -> dict[str, bytes | str]:
    """The stream fields of ``entry`` (``expires_at``: when it was stored plus its TTL; default now)."""
    response = entry.response
    is_object = dataclasses.is_dataclass(response) and not isinstance(response, type)
    body = dataclasses.asdict(response) if is_object else {"text": str(response)}
    meta = {
        "partition": list(entry.partition),
        "exact_key": entry.exact_key,
        "context_key": entry.context_key,
        "question": entry.question,
        "response": body,
        "expires_at": (time.time() if expires_at is None else expires_at) + entry.ttl_s,
    }
    vector = b"" if entry.vector is None else np.asarray(entry.vector, dtype=np.float32).tobytes()
    return {"m": json.dumps(meta, default=str), "v": vector}


def decode_entry(fields: dict[bytes, bytes]) -> SharedEntry:
    meta = json.loads(fields[b"m"])
    vector_bytes = fields.get(b"v", b"")
    vector = np.frombuffer(vector_bytes, dtype=np.float32).copy() if vector_bytes else None
    known = {f.name for f in dataclasses.fields(GatewayResponse)}
    response = GatewayResponse(**{k: v for k, v in meta["response"].items() if k in known})
    partition = (str(meta["partition"][0]), str(meta["partition"][1]))
    ttl_s = float(meta["expires_at"]) - time.time()
    return SharedEntry(partition, meta["exact_key"], meta["context_key"], meta["question"], response, vector, ttl_s)


class RedisCacheFeed:
    """Feeds ``cache`` from, and to, the other replicas through one Redis stream."""

    def __init__(self, cache: SemanticCache, client: Any, *, prefix: str = "tokenops", max_entries: int = 100_000):
        self.cache = cache
        self.client = client
        self.stream = f"{prefix}:semcache:feed"
        self.max_entries = max_entries
        self.origin = uuid.uuid4().hex
        self.last_id = "0-0"
        self.num_received = 0
        self.num_published = 0
        self.num_unpublished = 0
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        cache.on_store = self.publish
        cache.on_delete_tenant = self.publish_delete_tenant
        self._outbox: queue.SimpleQueue[dict[str, Any] | tuple[SharedEntry, float] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="semantic-cache-feed", daemon=True)
        self._thread.start()
        self._sender = threading.Thread(target=self._send_loop, name="semantic-cache-publish", daemon=True)
        self._sender.start()

    def publish(self, entry: SharedEntry) -> None:
        """Tell the other replicas: queued here, encoded and sent by the publisher thread (off the
        request's path; what queued meanwhile goes in one round trip)."""
        self._outbox.put((entry, time.time()))

    def publish_delete_tenant(self, tenant: str) -> None:
        self._outbox.put({"o": self.origin, "t": "delete_tenant", "tenant": tenant})

    def _send_loop(self) -> None:
        import redis

        while True:
            batch = [self._outbox.get()]
            while len(batch) < 256 and not self._outbox.empty():
                batch.append(self._outbox.get())
            fields = [
                {"o": self.origin, "t": "put", **encode_entry(*f)} if isinstance(f, tuple) else f
                for f in batch
                if f is not None
            ]
            if fields:
                # MINID trims what has outlived the TTL (stream ids are Redis' clock in ms)
                oldest = int((time.time() - self.cache.config.ttl_s) * 1000)
                try:
                    with self.client.pipeline(transaction=False) as pipe:
                        for f in fields:
                            pipe.xadd(self.stream, f, maxlen=self.max_entries, approximate=True)
                        pipe.xtrim(self.stream, minid=f"{max(0, oldest)}-0", approximate=True)
                        pipe.execute()
                    self.num_published += len(fields)
                except redis.RedisError as e:  # Redis away: this replica keeps its entries, the others miss them
                    self.num_unpublished += len(fields)
                    log.warning("semantic cache feed: %d not published (%s)", len(fields), e)
            if len(fields) < len(batch):  # close() asked to stop
                return

    def wait_caught_up(self, timeout_s: float = 10.0) -> bool:
        """True once the stream as it was at start has been read."""
        return self._caught_up.wait(timeout_s)

    def close(self) -> None:
        self._outbox.put(None)  # what was queued is sent first
        self._sender.join(timeout=5)
        self._stop.set()
        self._thread.join(timeout=5)
        if self.cache.on_store == self.publish:
            self.cache.on_store = None
            self.cache.on_delete_tenant = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                replies = self.client.xread({self.stream: self.last_id}, count=512, block=500)
            except Exception as e:  # Redis away: keep serving from the local cache, retry
                log.warning("semantic cache feed: %s", e)
                self._stop.wait(1.0)
                continue
            if not replies:
                self._caught_up.set()
                continue
            for _, messages in replies:
                for message_id, fields in messages:
                    self.last_id = message_id.decode() if isinstance(message_id, bytes) else message_id
                    self._apply(fields)

    def _apply(self, fields: dict[bytes, bytes]) -> None:
        if fields.get(b"o", b"").decode() == self.origin:
            return
        try:
            if fields.get(b"t") == b"delete_tenant":
                self.cache.delete_tenant(fields[b"tenant"].decode(), is_shared=False)
            elif self.cache.add_shared(decode_entry(fields)):
                self.num_received += 1
        except (KeyError, ValueError, TypeError) as e:
            log.warning("semantic cache feed: skipped an entry (%s)", e)
