"""Constants and helpers shared by the store tests (imported by name: tests have no packages)."""

from __future__ import annotations

from datetime import datetime, timezone

DAY1 = datetime(2026, 11, 1, 10, 0, 0)
DAY2 = datetime(2026, 11, 2, 15, 30, 0)


def epoch(dt: datetime) -> float:
    """Naive-UTC datetime as epoch seconds."""
    return dt.replace(tzinfo=timezone.utc).timestamp()
