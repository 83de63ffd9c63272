"""Shared helpers for the dashboard tests: the fake admin client and waiting on the app."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_admin import FakeAdminClient  # noqa: E402


@pytest.fixture
def fake_client() -> FakeAdminClient:
    return FakeAdminClient()


async def wait_until(pilot, predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
    """Let the app run until ``predicate()`` holds (workers report through messages)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)
    await pilot.pause()


@pytest.fixture
def anyio_backend():
    return "asyncio"


def run(coro):
    return asyncio.run(coro)
