"""Messages the dashboard's workers post back to the event loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message


@dataclass
class StatsReceived(Message):
    """A fresh ``/admin/stats`` snapshot."""

    stats: dict[str, Any]


@dataclass
class StatsFailed(Message):
    """A poll of ``/admin/stats`` failed; ``is_unreachable`` when no server answered."""

    error: str
    is_unreachable: bool


@dataclass
class TuningLoaded(Message):
    """Tunables and the ``config_changes`` history, fetched together."""

    tunables: list[dict[str, Any]]
    changes: dict[str, Any] | None


@dataclass
class TuningResult(Message):
    """The outcome of a PATCH: ``applied`` on success, else ``error`` (the server's reason)."""

    values: dict[str, Any]
    applied: dict[str, Any] | None
    error: str | None


@dataclass
class HistoryLoaded(Message):
    """Named store query results keyed by query name (a value is an error string on failure)."""

    results: dict[str, dict[str, Any] | str]


@dataclass
class LoadFailed(Message):
    """A screen's own fetch failed."""

    error: str
