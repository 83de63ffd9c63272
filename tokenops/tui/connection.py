"""The dashboard's view of its server connection."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ConnectionState:
    """``status`` is ``connecting``, ``connected``, ``unreachable`` or ``error`` (server said no)."""

    url: str
    status: str = "connecting"
    error: str | None = None
    num_failures: int = 0
    retry_in_s: float | None = None
    uptime_s: float | None = None
    is_paused: bool = False

    def __post_init__(self) -> None:
        assert self.status in ("connecting", "connected", "unreachable", "error"), self.status

    @property
    def is_connected(self) -> bool:
        return self.status == "connected"
