"""Gateways: the service's gateway replicas with their health (key ``g``), from ``GET
/admin/gateways``: which replicas are up, draining, stopped or gone quiet (down), how busy each is
and when it was last heard from (docs/deploy.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Static

from tokenops.tui.client import AdminError
from tokenops.tui.format import fmt_int
from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.tables import ensure_columns, sync_rows

GATEWAY_COLUMNS = (
    ("id", "gateway"),
    ("url", "url"),
    ("health", "health"),
    ("phase", "phase"),
    ("ready", "ready"),
    ("in_flight", "in flight"),
    ("seen", "last seen"),
    ("up_for", "up for"),
)
_HEALTH = {"up": "[green]● up[/]", "down": "[red]✖ down[/]", "stopped": "[dim]■ stopped[/]"}


@dataclass
class GatewaysLoaded(Message):
    """``GET /admin/gateways``'s list, or ``error`` (the server's reason)."""

    gateways: list[dict[str, Any]] | None
    error: str | None = None


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def gateway_cells(gateway: dict[str, Any], now: float) -> list[Any]:
    name = gateway["id"] + (" (this)" if gateway.get("is_self") else "")
    return [
        name,
        gateway.get("url", "–"),
        _HEALTH.get(gateway["health"], gateway["health"]),
        gateway.get("phase", "–"),
        "yes" if gateway.get("ready") else "no",
        fmt_int(gateway.get("in_flight")),
        "now" if gateway.get("is_self") else f"{fmt_age(gateway.get('seen_s_ago'))} ago",
        fmt_age(now - gateway["started_at"]) if gateway.get("started_at") else "–",
    ]


def summary(gateways: list[dict[str, Any]]) -> str:
    counts = {h: sum(g["health"] == h for g in gateways) for h in ("up", "down", "stopped")}
    parts = [f"{n} {h}" for h, n in counts.items() if n]
    return f"{len(gateways)} gateway{'s' if len(gateways) != 1 else ''}: " + ", ".join(parts)


class GatewaysScreen(DashboardScreen):
    SCREEN_TITLE = "Gateways"
    DEFAULT_CSS = """
    GatewaysScreen #gateways-summary { height: 1; margin: 1 0 0 0; padding: 0 1; }
    GatewaysScreen #gateways-error { color: $error; padding: 0 1; }
    """

    def compose_body(self) -> ComposeResult:
        yield Static("", id="gateways-summary")
        yield Static("", id="gateways-error")
        table: DataTable[Any] = DataTable(id="gateways", cursor_type="row", zebra_stripes=True)
        table.border_title = "gateway replicas of this service ([shared] redis_url: every replica's heartbeat)"
        yield table

    def on_mount(self) -> None:
        ensure_columns(self.query_one("#gateways", DataTable), GATEWAY_COLUMNS)

    def show_stats(self, stats: dict[str, Any]) -> None:
        self.load()  # every stats poll: the app's one-shot timer paces this view too

    @work(thread=True, exclusive=True, group="gateways-load")
    def load(self) -> None:
        try:
            self.post_message(GatewaysLoaded(self.app.client.gateways()["gateways"]))
        except AdminError as e:
            self.post_message(GatewaysLoaded(None, e.message))

    @on(GatewaysLoaded)
    def _loaded(self, message: GatewaysLoaded) -> None:
        error = self.query_one("#gateways-error", Static)
        error.display = message.error is not None
        if message.gateways is None:
            error.update(f"✖ /admin/gateways: {message.error}")
            return
        now = time.time()
        with self.app.batch_update():
            self.query_one("#gateways-summary", Static).update(summary(message.gateways))
            rows = {g["id"]: gateway_cells(g, now) for g in message.gateways}
            sync_rows(self.query_one("#gateways", DataTable), rows, keep_order=True)
