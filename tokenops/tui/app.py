"""The ``tokenops dashboard`` app: polls ``/admin/stats`` and renders the active screen."""

from __future__ import annotations

import contextlib
import io
from collections import deque
from typing import Any

from rich.console import Console
from textual import on, work
from textual.app import App, ScreenStackError
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.timer import Timer

from tokenops.tui.client import AdminError, Client, ServerUnreachable
from tokenops.tui.connection import ConnectionState
from tokenops.tui.messages import StatsFailed, StatsReceived
from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.screens.batch_view import BatchesScreen
from tokenops.tui.screens.engine import EngineScreen
from tokenops.tui.screens.experts import ExpertsScreen
from tokenops.tui.screens.gateways_view import GatewaysScreen
from tokenops.tui.screens.history import HistoryScreen
from tokenops.tui.screens.models import ModelsScreen
from tokenops.tui.screens.overview import OverviewScreen
from tokenops.tui.screens.tuning import TuningScreen

#: Client-side samples kept per replica for the Engine charts (one per poll).
ENGINE_HISTORY_LEN = 300


class DashboardApp(App[None]):
    """Live view of a tokenops server with live tuning.

    One poll is in flight at a time: each poll's result re-arms a one-shot timer,
    every ``poll_interval_s`` when the server answers and with exponential backoff
    (up to ``max_backoff_s``) when it does not.
    """

    CSS_PATH = "app.tcss"
    TITLE = "tokenops dashboard"
    MODES = {
        "overview": OverviewScreen,
        "engine": EngineScreen,
        "models": ModelsScreen,
        "experts": ExpertsScreen,
        "tuning": TuningScreen,
        "history": HistoryScreen,
        "batches": BatchesScreen,
        "gateways": GatewaysScreen,
    }
    DEFAULT_MODE = "overview"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("1", "switch_mode('overview')", "Overview"),
        Binding("2", "switch_mode('engine')", "Engine"),
        Binding("3", "switch_mode('models')", "Models"),
        Binding("4", "switch_mode('experts')", "Experts"),
        Binding("5", "switch_mode('tuning')", "Tuning"),
        Binding("6", "switch_mode('history')", "History"),
        Binding("b", "switch_mode('batches')", "Batches"),
        Binding("g", "switch_mode('gateways')", "Gateways", show=False),  # named in the screen's title bar
        Binding("p", "toggle_pause", "Pause", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        client: Client,
        poll_interval_s: float = 1.0,
        max_backoff_s: float = 16.0,
        prewarm_screens: bool = False,
        history: Any = None,
    ) -> None:
        super().__init__()
        #: A :class:`tokenops.tui.merged_history.MergedHistory` (``--history-store``): the History
        #: screen reads the replicas' stores as one instead of the server's ``/admin/query``.
        self.history = history
        #: Build every screen once at start-up: a screen's first visit costs a full CSS pass
        #: (~0.2-0.4 s of CPU in Textual 8), which would otherwise land mid-session.
        self.prewarm_screens = prewarm_screens
        assert poll_interval_s > 0 and max_backoff_s >= poll_interval_s
        self.client = client
        self.poll_interval_s = poll_interval_s
        self.max_backoff_s = max_backoff_s
        self.connection = ConnectionState(url=client.url)
        #: The snapshot the screens rendered last (tests compare widgets with it).
        self.last_stats: dict[str, Any] | None = None
        self.num_polls = 0
        self.engine_history: dict[str, deque[tuple[float | None, float | None]]] = {}
        self._timer: Timer | None = None
        self._is_polling = False

    def on_mount(self) -> None:
        self._start_poll()
        if self.prewarm_screens:
            self.call_after_refresh(self._prewarm)

    async def _prewarm(self) -> None:
        for mode in self.MODES:
            if mode != self.DEFAULT_MODE:
                await self.switch_mode(mode)
        await self.switch_mode(self.DEFAULT_MODE)

    def _start_poll(self) -> None:
        """Start one poll unless one is in flight (its result re-arms the timer)."""
        if self._is_polling:
            return
        self._is_polling = True
        self.poll_stats()

    @work(thread=True, exclusive=True, group="stats")
    def poll_stats(self) -> None:
        """Fetch ``/admin/stats`` off the event loop; the result comes back as a message."""
        try:
            stats = self.client.stats()
        except ServerUnreachable as e:
            self.post_message(StatsFailed(e.message, is_unreachable=True))
        except AdminError as e:
            self.post_message(StatsFailed(e.message, is_unreachable=False))
        except Exception as e:  # noqa: BLE001 - a bad payload must not stop the polling loop
            self.post_message(StatsFailed(f"{type(e).__name__}: {e}", is_unreachable=False))
        else:
            self.post_message(StatsReceived(stats))

    @on(StatsReceived)
    def _stats_received(self, message: StatsReceived) -> None:
        self._is_polling = False
        stats = message.stats
        self.num_polls += 1
        self.last_stats = stats
        for name, engine in (stats.get("engines") or {}).items():
            samples = self.engine_history.setdefault(name, deque(maxlen=ENGINE_HISTORY_LEN))
            samples.append((engine.get("last_batch_tokens"), engine.get("kv_cache_usage")))
        state = self.connection
        state.status, state.error, state.num_failures, state.retry_in_s = "connected", None, 0, None
        state.uptime_s = stats.get("uptime_s")
        screen = self._dashboard_screen()
        if screen is not None:
            try:
                screen.show_connection(state)
                screen.show_stats(stats)
            except NoMatches:
                pass  # the screen is still composing; it renders last_stats when it is shown
            except (KeyError, TypeError, ValueError) as e:
                self.notify(f"cannot render stats: {type(e).__name__}: {e}", severity="error", timeout=3)
        self._rearm(self.poll_interval_s)

    @on(StatsFailed)
    def _stats_failed(self, message: StatsFailed) -> None:
        self._is_polling = False
        self.num_polls += 1
        state = self.connection
        state.num_failures += 1
        state.status = "unreachable" if message.is_unreachable else "error"
        state.error = message.error
        delay = min(self.max_backoff_s, self.poll_interval_s * 2 ** (state.num_failures - 1))
        state.retry_in_s = delay
        screen = self._dashboard_screen()
        if screen is not None:
            with contextlib.suppress(NoMatches):
                screen.show_connection(state)
        self._rearm(delay)

    def _dashboard_screen(self) -> DashboardScreen | None:
        """The active screen, or None while the app starts or shuts down."""
        try:
            screen = self.screen
        except ScreenStackError:
            return None
        return screen if isinstance(screen, DashboardScreen) and screen.is_mounted else None

    def _rearm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.stop()
        self._timer = None if self.connection.is_paused else self.set_timer(delay, self._start_poll)

    def screen_text(self) -> str:
        """The current screen as plain text (what a person would read; used by tests)."""
        width, height = self.size
        console = Console(
            width=width, height=height, file=io.StringIO(), force_terminal=True, record=True, legacy_windows=False
        )
        console.print(self.screen._compositor.render_update(full=True, screen_stack=self._background_screens))
        return console.export_text()

    def action_toggle_pause(self) -> None:
        """Stop or resume polling (the last snapshot stays on screen)."""
        self.connection.is_paused = not self.connection.is_paused
        if self.connection.is_paused and self._timer is not None:
            self._timer.stop()
            self._timer = None
        elif not self.connection.is_paused:
            self._start_poll()
        screen = self._dashboard_screen()
        if screen is not None:
            with contextlib.suppress(NoMatches):
                screen.show_connection(self.connection)
