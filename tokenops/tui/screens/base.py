"""What every dashboard screen shares: the connection banner on top, the key footer below."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer

from tokenops.tui.connection import ConnectionState
from tokenops.tui.widgets.connection_banner import ConnectionBanner

if TYPE_CHECKING:
    from collections import deque

    from textual import getters
    from textual.app import App

    from tokenops.tui.client import Client

    class DashboardHost(App[None]):
        """What the screens read from :class:`tokenops.tui.app.DashboardApp`, declared here
        because app.py imports the screens (a type-only view, never instantiated)."""

        client: Client
        connection: ConnectionState
        last_stats: dict[str, Any] | None
        engine_history: dict[str, deque[tuple[float | None, float | None]]]


class DashboardScreen(Screen):
    """Subclasses implement :meth:`compose_body` and :meth:`show_stats`."""

    SCREEN_TITLE = ""

    if TYPE_CHECKING:  # every dashboard screen runs inside the dashboard app (textual's typed getter)
        app = getters.app(DashboardHost)

    def compose(self) -> ComposeResult:
        yield ConnectionBanner(self.SCREEN_TITLE)
        yield from self.compose_body()
        yield Footer(compact=True)

    def compose_body(self) -> ComposeResult:
        raise NotImplementedError

    def on_screen_resume(self) -> None:
        self.show_connection(self.app.connection)
        if self.app.last_stats is not None:
            self.show_stats(self.app.last_stats)

    def show_connection(self, state: ConnectionState) -> None:
        self.query_one(ConnectionBanner).show(state)

    def show_stats(self, stats: dict[str, Any]) -> None:
        """Render a ``/admin/stats`` snapshot (called only while this screen is active)."""
