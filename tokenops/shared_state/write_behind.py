"""Two pieces the Redis-backed shared state uses to keep round trips off a request's path.

- :class:`WatchedKey`: one optimistic read-modify-write of a key on one connection: ``WATCH`` and
  ``GET`` sent together (one round trip), later ``MULTI``, the writes and ``EXEC`` sent together
  (one more), which Redis runs only if nobody wrote the key since the ``WATCH``. No value passes
  through a Lua script (a 64 KB string handed to Lua and back costs Redis ~0.3 ms of its one
  thread; a plain ``SET`` of it ~0.01 ms).
- :class:`WriteBehind`: one thread that runs writes after the request that asked for them has gone
  on, in the order they were asked; :meth:`WriteBehind.wait_key` lets a later request on the same
  key wait for the earlier ones to land (read your writes), :meth:`WriteBehind.flush` waits for all.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class WatchedKey:
    """``WATCH`` + ``GET`` now, ``MULTI`` ... ``EXEC`` later (possibly from another thread), then
    :meth:`close`. A connection left in an unknown state (an error) is dropped, not reused."""

    def __init__(self, client: Any, key: str) -> None:
        self.pool = client.connection_pool
        self.key = key
        self.conn: Any = self.pool.get_connection()
        self.is_done = False

    def _send(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        self.conn.send_packed_command(self.conn.pack_commands(commands))
        return [self.conn.read_response() for _ in commands]

    def read(self, *keys: str) -> list[bytes | None]:
        """The values of ``keys`` (default: the watched key), read at once with ``MGET``."""
        return list(self._send([("WATCH", self.key), ("MGET", *(keys or (self.key,)))])[1])

    def commit(self, commands: list[tuple[Any, ...]]) -> list[Any] | None:
        """The replies of ``commands``; None when another client wrote the key (nothing was run)."""
        self.is_done = True
        replies = self._send([("MULTI",), *commands, ("EXEC",)])[-1]
        for reply in replies or ():
            if isinstance(reply, Exception):
                raise reply
        return replies

    def close(self, failed: bool = False) -> None:
        if self.conn is None:
            return
        try:
            if failed:
                self.conn.disconnect()
            elif not self.is_done:
                self._send([("UNWATCH",)])
        except Exception:
            self.conn.disconnect()
        finally:
            self.pool.release(self.conn)
            self.conn = None

    def __enter__(self) -> WatchedKey:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(failed=exc_type is not None)


class WriteBehind:
    """Runs submitted writes on one daemon thread, in order; counts what is pending per key."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[str, Callable[[], None]]] = queue.SimpleQueue()
        self._pending: dict[str, int] = {}
        self._idle = threading.Condition()
        ref = weakref.ref(self)
        # the thread holds this object weakly: one dropped (a reconfigured memory) stops it
        self._thread = threading.Thread(target=_run, args=(ref, self._jobs), name=name, daemon=True)
        self._thread.start()
        atexit.register(lambda: (w := ref()) is not None and w.flush(timeout_s=5.0))

    def submit(self, key: str, job: Callable[[], None]) -> None:
        with self._idle:
            self._pending[key] = self._pending.get(key, 0) + 1
        self._jobs.put((key, job))

    def _done(self, key: str) -> None:
        with self._idle:
            left = self._pending.pop(key) - 1
            if left:
                self._pending[key] = left
            self._idle.notify_all()

    def wait_key(self, key: str, timeout_s: float = 10.0) -> bool:
        """Wait until the writes submitted for ``key`` have run; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: key not in self._pending, timeout=timeout_s)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every submitted write has run; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout=timeout_s)


def _run(ref: weakref.ref[WriteBehind], jobs: queue.SimpleQueue[tuple[str, Callable[[], None]]]) -> None:
    """The thread: runs the jobs in order while its :class:`WriteBehind` exists (a job holds its
    object alive until it ran)."""
    while True:
        try:
            key, job = jobs.get(timeout=1.0)
        except queue.Empty:
            if ref() is None:
                return
            continue
        try:
            job()
        except Exception:  # a job handles its own errors: this is a bug, say so and go on
            log.exception("write-behind job failed")
        writes = ref()
        if writes is not None:
            writes._done(key)
        del job, writes
