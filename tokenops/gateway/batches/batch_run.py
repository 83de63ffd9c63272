"""One batch while the runner runs it (:mod:`.batch_runner`): its output files, live counts,
lines in flight, whether it was cancelled, and its recent rate; and where the state is shared by
several gateway replicas, each finished line saved to it as it finishes (:class:`LineSaver`), so a
replica that takes the batch over after this one died runs only the lines not finished."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

from tokenops.gateway.batches.batch_output import DurableAppender, Recovered, recover
from tokenops.store.batch_store import BatchStore, output_ids

log = logging.getLogger("tokenops.batches")


class LineSaver:
    """Saves finished lines to the shared state (``BatchState.save_lines``) by group commit: a line
    waits for the write that carries it, and the lines that finish while one write is under way go
    together in the next (one round trip for many lines under load, one per line when idle)."""

    def __init__(self, store: Any, batch_id: str) -> None:
        self.store = store
        self.batch_id = batch_id
        self._pending: list[tuple[str, bool, bytes]] = []
        self._next: asyncio.Future | None = None  # done when the write carrying ``_pending`` is
        self._writer: asyncio.Task | None = None
        self.num_writes = 0

    async def save(self, custom_id: str, is_error: bool, line: bytes) -> None:
        """Return once ``line`` is saved; a cancel of the caller does not stop the write."""
        self._pending.append((custom_id, is_error, line))
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        done = self._next
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())
        await asyncio.shield(done)

    async def _write(self) -> None:
        while self._pending:
            lines, done = self._pending, self._next
            self._pending, self._next = [], None
            assert done is not None
            try:
                await asyncio.to_thread(self.store.save_lines, self.batch_id, lines)
                self.num_writes += 1
                done.set_result(None)
            except Exception as e:  # the lines stay in the local files; a takeover would run them again
                log.warning("batch %s: saving %d finished lines failed: %s", self.batch_id, len(lines), e)
                done.set_result(None)

    async def drain(self) -> None:
        while self._writer is not None and not self._writer.done():
            await asyncio.gather(self._writer, return_exceptions=True)


class BatchRun:
    """One batch while it runs: its files, live counts, lines in flight, whether it was cancelled."""

    def __init__(self, row: dict[str, Any], store: BatchStore) -> None:
        self.row = row
        self.store = store
        self.id: str = row["id"]
        out, err = output_ids(self.id)
        self.paths = (store.path(out), store.path(err))
        self.appender = DurableAppender(*self.paths)
        self.saver = LineSaver(store, self.id) if getattr(store, "is_shared", False) else None
        self.num_completed = 0
        self.num_failed = 0
        self.in_flight: set[asyncio.Task] = set()
        self.is_cancelled = False
        self.counts_written_at = 0.0
        #: (monotonic time, generated tokens) of each line this process finished: the recent rate
        self.finished: collections.deque[tuple[float, int]] = collections.deque(maxlen=4096)
        self.started = time.monotonic()

    def recover(self) -> Recovered:
        """(worker thread) What is done: the lines in the local files, and where the state is shared,
        the lines another replica saved before it died, appended to the local files first."""
        found = recover(*self.paths)
        if self.saver is None:
            return found
        saved = [x for x in self.store.saved_lines(self.id) if x[0] not in found.done]
        for custom_id, is_error, line in saved:
            self.appender.append_now(is_error, line)
            found.done.add(custom_id)
        return recover(*self.paths) if saved else found

    async def forget_saved(self) -> None:
        """The batch is finished: its saved lines are in its output files, drop them."""
        if self.saver is not None:
            try:
                await asyncio.to_thread(self.store.forget_lines, self.id)
            except Exception as e:
                log.warning("batch %s: dropping its saved lines failed: %s", self.id, e)

    async def record(self, custom_id: str, is_error: bool, line: bytes) -> None:
        """A finished line: on disk (fsync-ed), then saved to the shared state where there is one;
        the runner counts it after this returns."""
        await self.appender.append(is_error, line)
        if self.saver is not None:
            await self.saver.save(custom_id, is_error, line)

    async def drain(self) -> None:
        """Every write under way finished (the local files, then the shared state)."""
        await self.appender.drain()
        if self.saver is not None:
            await self.saver.drain()

    def rate(self, window_s: float = 30.0) -> dict[str, float]:
        """Lines/s and generated tokens/s over the last ``window_s`` (or since this process took it up)."""
        now = time.monotonic()
        span = max(1e-3, min(window_s, now - self.started))
        recent = [n for t, n in self.finished if t >= now - span]
        return {"lines_per_s": len(recent) / span, "tokens_per_s": sum(recent) / span}
