"""The queue an upstream engine reports on its ``/metrics``: batch lines wait while it is not empty.

``[[models]] batch_upstream_queue = true`` (backend "openai") has the batch meter
(:mod:`tokenops.backends.openai_http_meter`) read the upstream's own count of waiting requests
while batch lines are in flight or waiting: vLLM's ``vllm:num_requests_waiting``, SGLang's
``sglang:num_queue_reqs``, another tokenops's ``tokenops:num_requests_waiting`` (summed over
their label sets). A request waiting there means the upstream's slots are full; a batch line sent
then would queue ahead of the interactive requests that come after it (an upstream serves first
come first served unless it takes ``priority``). So no batch line is let in while the reading is
above zero, and after a reading of zero at most as many as are in flight (at least one) until the
next: the lines in flight double per reading while the upstream has room, as a slow start.

An upstream whose ``/metrics`` cannot be read (no such path, a refused key, none of the names)
turns the gate off until a later attempt (``retry_s``) reads it; this is logged once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

#: The gauges of waiting requests the known engines expose.
WAITING_METRICS = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tokenops:num_requests_waiting")


def waiting_requests(text: str) -> int | None:
    """The waiting requests of a Prometheus text exposition (summed over label sets); None when
    it has none of :data:`WAITING_METRICS`."""
    total, seen = 0.0, False
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)[0], line.rsplit("}", 1)[-1]
        else:
            name, _, rest = line.partition(" ")
        if name.strip() not in WAITING_METRICS:
            continue
        try:
            total += float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        seen = True
    return round(total) if seen else None


class QueueWatch:
    """Reads ``fetch()`` (the upstream's ``/metrics``: a response with ``status_code`` and ``text``)
    every ``interval_s`` while ``busy()``, and hands each reading to ``on_reading`` (None: unreadable)."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[Any]],
        on_reading: Callable[[int | None], None],
        interval_s: float = 0.25,
        retry_s: float = 30.0,
    ) -> None:
        self.fetch, self.on_reading = fetch, on_reading
        self.interval_s, self.retry_s = interval_s, retry_s
        self.num_readings = 0
        self._task: asyncio.Task[None] | None = None
        self._warned = False

    def ensure_running(self, busy: Callable[[], bool]) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(busy))

    async def read(self) -> int | None:
        try:
            response = await self.fetch()
            waiting = waiting_requests(response.text) if response.status_code == 200 else None
            why = (
                f"HTTP {response.status_code}"
                if response.status_code != 200
                else "none of " + ", ".join(WAITING_METRICS)
            )
        except Exception as e:  # noqa: BLE001 - an unreachable upstream only turns the gate off
            waiting, why = None, type(e).__name__
        if waiting is None and not self._warned:
            self._warned = True
            log.warning("batch_upstream_queue: cannot read the upstream's waiting requests (%s); batch lines "
                        "are not held on its queue until it can be read", why)  # fmt: skip
        return waiting

    async def _run(self, busy: Callable[[], bool]) -> None:
        while busy():
            waiting = await self.read()
            self.num_readings += 1
            self.on_reading(waiting)
            await asyncio.sleep(self.interval_s if waiting is not None else self.retry_s)
