"""One batch while the runner runs it (:mod:`.batch_runner`): its output files, live counts,
lines in flight, whether it was cancelled, and its recent rate."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from tokenops.gateway.batches.batch_output import DurableAppender
from tokenops.store.batch_store import BatchStore, output_ids


class BatchRun:
    """One batch while it runs: its files, live counts, lines in flight, whether it was cancelled."""

    def __init__(self, row: dict[str, Any], store: BatchStore) -> None:
        self.row = row
        self.id: str = row["id"]
        out, err = output_ids(self.id)
        self.paths = (store.path(out), store.path(err))
        self.appender = DurableAppender(*self.paths)
        self.num_completed = 0
        self.num_failed = 0
        self.in_flight: set[asyncio.Task] = set()
        self.is_cancelled = False
        self.counts_written_at = 0.0
        #: (monotonic time, generated tokens) of each line this process finished: the recent rate
        self.finished: collections.deque[tuple[float, int]] = collections.deque(maxlen=4096)
        self.started = time.monotonic()

    def rate(self, window_s: float = 30.0) -> dict[str, float]:
        """Lines/s and generated tokens/s over the last ``window_s`` (or since this process took it up)."""
        now = time.monotonic()
        span = max(1e-3, min(window_s, now - self.started))
        recent = [n for t, n in self.finished if t >= now - span]
        return {"lines_per_s": len(recent) / span, "tokens_per_s": sum(recent) / span}
