"""The batch meter of one upstream model: batch lines yield to interactive requests.

An upstream engine (vLLM, SGLang) schedules what it is sent; the gateway cannot preempt work
there. What it can do is hold back batch lines, in one of two ways:

- **a fixed bound** (``[[models]] batch_max_in_flight_upstream``; 0: no bound): while interactive
  requests of this upstream model are in flight, at most that many batch lines are;
- **an SLO** (``[batches] upstream_ttft_slo_ms``, live as ``batches.upstream_ttft_slo_ms``; 0: off):
  the meter measures the time to first token of the interactive requests it streams and sizes
  the batch lines in flight to keep it under the SLO, always (not only while interactive requests
  are in flight: lines sent between two interactive requests are what the next one queues behind).
  As TCP sizes its window: the allowance starts at one line and doubles per ``window_s`` without a
  measured time over ``HEADROOM`` (0.8) of the SLO while lines are waiting (slow start), until the
  first time over the SLO; from then on one more line per such window (additive increase); a window
  whose slowest first token is between 0.8 and 1 times the SLO holds it; a time over the SLO halves
  the lines in flight, once per window (the lines already upstream take a while to drain). The
  fixed bound, when set, is the allowance's ceiling. With nothing interactive in flight one line always may run,
  so a batch never stalls on an allowance of 0;
- and, with ``[[models]] batch_upstream_queue = true``, **the upstream's own queue** as its
  ``/metrics`` reports it (:mod:`tokenops.backends.upstream_queue`): no line while requests wait there.

Batch lines already running are never cancelled; the next ones wait until there is room and are
then let in oldest first. Plain asyncio, one event loop: no lock is needed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tokenops.backends.upstream_queue import QueueWatch

BATCH = "batch"
#: the allowance's ceiling with an SLO and no fixed bound
MAX_ALLOWANCE = 256
#: a window grows the allowance only if its slowest first token was under this share of the SLO
HEADROOM = 0.8


class Slot:
    """One request in flight: :meth:`first_token` once its first token arrives (streams)."""

    def __init__(self, meter: BatchMeter, interactive: bool) -> None:
        self._meter, self._interactive = meter, interactive
        self._start = meter.clock()
        self._seen = False

    def first_token(self) -> None:
        if not self._seen:
            self._seen = True
            if self._interactive:
                self._meter.observe_ttft(self._meter.clock() - self._start)


class BatchMeter:
    """Counts this upstream model's requests in flight by class and holds back batch ones."""

    def __init__(
        self, limit: int = 0, slo_s: float = 0.0, window_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        assert limit >= 0 and slo_s >= 0 and window_s > 0
        self.limit = limit
        self.slo_s = slo_s
        self.window_s = window_s
        self.clock = clock
        self.num_interactive = 0
        self.num_batch = 0
        self.num_held = 0  # batch lines that waited for room (a counter)
        self.num_over_slo = 0  # interactive first tokens measured over the SLO (a counter)
        #: batch lines that may be in flight (with an SLO; sized from the measured first tokens)
        self.allowance = 1
        self._slow_start = True  # doubling per clean window, until the first time over the SLO
        self._window_start = clock()
        self._halved = False  # the allowance was halved in the current window
        self._worst = 0.0  # the slowest first token measured in the current window
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it meters on (seen at the first request)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        #: The upstream's waiting requests at the last reading (batch_upstream_queue); None: not read
        self.upstream_waiting: int | None = None
        self.watch: QueueWatch | None = None
        self._burst = 1  # lines that may start until the next reading (after one of zero)
        self._let_in = 0  # lines started since the last reading

    def watch_queue(self, fetch: Callable[[], Awaitable[Any]], interval_s: float = 0.25) -> None:
        """Hold batch lines on the upstream's own queue, read with ``fetch`` (its ``/metrics``)."""
        self.watch = QueueWatch(fetch, self._on_reading, interval_s)
        self.upstream_waiting = 0  # until the first reading: one line

    def _on_reading(self, waiting: int | None) -> None:
        self.upstream_waiting = waiting
        self._burst, self._let_in = max(1, self.num_batch), 0
        self._wake()

    @property
    def ceiling(self) -> int:
        return self.limit or MAX_ALLOWANCE

    def set_slo(self, slo_s: float) -> None:
        """Change the SLO (the live tunable); 0 turns it off. The allowance starts over (slow start)."""
        self.slo_s = max(0.0, float(slo_s))
        self.allowance, self._slow_start = 1, True
        self._window_start, self._halved, self._worst = self.clock(), False, 0.0
        self._wake()

    def set_slo_from_thread(self, slo_s: float) -> None:
        """:meth:`set_slo` from another thread (the admin API applies tunables in one): on the meter's loop."""
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(self.set_slo, slo_s)
        else:  # no request seen yet: nothing runs on the meter
            self.set_slo(slo_s)

    def observe_ttft(self, seconds: float) -> None:
        """An interactive request's time to first token at this upstream."""
        if self.slo_s <= 0:
            return
        self._advance()
        self._worst = max(self._worst, seconds)
        if seconds > self.slo_s:
            self.num_over_slo += 1
            self._slow_start = False
            if not self._halved:  # half of what is in flight (TCP's flight size), not of a ceiling never reached
                self.allowance = min(self.allowance, self.num_batch) // 2
                self._halved = True
        self._wake()  # the windows closed may have grown the allowance

    def _advance(self) -> None:
        """Close the windows that have passed: each one without a first token over the SLO grows the
        allowance (doubles it in slow start, else adds a line) while lines are waiting for room."""
        elapsed = int((self.clock() - self._window_start) // self.window_s)
        if elapsed <= 0:
            return
        # the windows after the first were clean (nothing measured); the first, if its slowest first
        # token had HEADROOM below the SLO: between that and the SLO the allowance holds
        clean = elapsed - (self._worst > HEADROOM * self.slo_s)
        if clean and self._waiters:
            grown = max(1, self.allowance) * 2 ** min(clean, 16) if self._slow_start else self.allowance + clean
            self.allowance = min(self.ceiling, grown)
        self._window_start += elapsed * self.window_s
        self._halved, self._worst = False, 0.0

    def _has_room(self) -> bool:
        if self.upstream_waiting is not None and (self.upstream_waiting > 0 or self._let_in >= self._burst):
            return False  # requests wait at the upstream, or this reading's lines have gone in
        if self.slo_s > 0:
            self._advance()
            return self.num_batch < (self.allowance if self.num_interactive else max(self.allowance, 1))
        return not self.limit or not self.num_interactive or self.num_batch < self.limit

    @contextlib.asynccontextmanager
    async def hold(self, priority_class: str) -> AsyncIterator[Slot]:
        """In flight for the body of the ``async with``; a batch line first waits for room."""
        self._loop = asyncio.get_running_loop()
        if priority_class != BATCH:
            self.num_interactive += 1
            try:
                yield Slot(self, interactive=True)
            finally:
                self.num_interactive -= 1
                self._wake()
            return
        await self._enter_batch()
        try:
            yield Slot(self, interactive=False)
        finally:
            self._leave_batch()

    async def _enter_batch(self) -> None:
        if self.watch is not None:
            self.watch.ensure_running(lambda: self.num_batch > 0 or bool(self._waiters))
        if not self._waiters and self._has_room():
            self.num_batch += 1
            self._let_in += 1
            return
        self.num_held += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self._arm()
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
                self._let_in += 1
                future.set_result(None)
        self._arm()

    def _arm(self) -> None:
        """With an SLO, lines waiting and nothing else to wake them: look again when the window closes
        (the allowance grows with time, not only with requests)."""
        if self.slo_s <= 0 or not self._waiters or self._timer is not None:
            return
        delay = max(0.0, self._window_start + self.window_s - self.clock()) + 1e-3

        def fire() -> None:
            self._timer = None
            self._wake()

        self._timer = asyncio.get_running_loop().call_later(delay, fire)
