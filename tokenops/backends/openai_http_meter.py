"""The batch meter of one upstream model: batch lines yield to interactive requests.

An upstream engine (vLLM, SGLang) schedules what it is sent; the gateway cannot preempt work
there. What it can do is hold back batch lines: while interactive requests of this upstream model
are in flight, at most ``limit`` batch lines are (``[[models]] batch_max_in_flight_upstream``;
0: no bound). Batch lines already running when interactive work arrives finish (nothing is
cancelled); the next ones wait until there is room or no interactive request is in flight, and
are then let in oldest first. Plain asyncio, one event loop: no lock is needed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

BATCH = "batch"


class BatchMeter:
    """Counts this upstream model's requests in flight by class and holds back batch ones."""

    def __init__(self, limit: int = 0) -> None:
        assert limit >= 0
        self.limit = limit
        self.num_interactive = 0
        self.num_batch = 0
        self.num_held = 0  # batch lines that waited for room (a counter)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def _has_room(self) -> bool:
        return not self.limit or not self.num_interactive or self.num_batch < self.limit

    @contextlib.asynccontextmanager
    async def hold(self, priority_class: str) -> AsyncIterator[None]:
        """In flight for the body of the ``async with``; a batch line first waits for room."""
        if priority_class != BATCH:
            self.num_interactive += 1
            try:
                yield
            finally:
                self.num_interactive -= 1
                self._wake()
            return
        await self._enter_batch()
        try:
            yield
        finally:
            self._leave_batch()

    async def _enter_batch(self) -> None:
        if not self._waiters and self._has_room():
            self.num_batch += 1
            return
        self.num_held += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future  # _wake counts it in before it resolves the future
        except BaseException:
            if future.done() and not future.cancelled():
                self._leave_batch()  # room came as the line was cancelled: pass it on
            else:  # _wake may have dropped it already (a cancelled future is done)
                with contextlib.suppress(ValueError):
                    self._waiters.remove(future)
            raise

    def _leave_batch(self) -> None:
        self.num_batch -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._has_room():
            future = self._waiters.popleft()
            if not future.done():
                self.num_batch += 1
                future.set_result(None)
