"""Waiting on a running dashboard in Pilot tests."""

from __future__ import annotations

import time


async def wait_until(pilot, predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
    """Let the app run until ``predicate()`` holds (workers report through messages)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)
    await pilot.pause()
