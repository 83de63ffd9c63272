"""History: named store queries (tokens and cost by model per day, latency percentiles per hour,
image requests' denoising steps and step-cache reuse per hour), from the server's store, or with
``--history-store`` from several gateway replicas' stores read as one
(:class:`tokenops.tui.merged_history.MergedHistory`)."""

from __future__ import annotations

from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from tokenops.tui.client import AdminError
from tokenops.tui.format import fmt_cell
from tokenops.tui.messages import HistoryLoaded
from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.tables import ensure_columns, sync_rows

#: (query name, table title) shown on this screen, top to bottom.
QUERIES = (
    ("usage_by_model_day", "tokens and cost by model per day"),
    ("latency_by_model_hour", "latency percentiles by model per hour"),
    ("images_by_model_hour", "image requests: steps and step-cache reuse by model per hour"),
)


class HistoryScreen(DashboardScreen):
    SCREEN_TITLE = "History"
    BINDINGS = [Binding("u", "reload", "Reload")]

    def compose_body(self) -> ComposeResult:
        merged = getattr(self.app, "history", None)
        if merged is not None:
            yield Static(f"read from {merged.label}: {', '.join(merged.paths)}", id="history-source")
        with VerticalScroll(id="history"):
            for name, title in QUERIES:
                table: DataTable[Any] = DataTable(id=name, cursor_type="row", zebra_stripes=True)
                table.border_title = title
                yield table
                yield Static("", id=f"{name}-error", classes="query-error")

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.action_reload()

    def action_reload(self) -> None:
        self.load()

    @work(thread=True, exclusive=True, group="history-load")
    def load(self) -> None:
        merged = getattr(self.app, "history", None)  # --history-store: the replicas' stores as one
        if merged is not None:
            self.post_message(HistoryLoaded(merged.queries([name for name, _ in QUERIES])))
            return
        results: dict[str, dict | str] = {}
        for name, _ in QUERIES:
            try:
                results[name] = self.app.client.query(name)
            except AdminError as e:
                results[name] = e.message
        self.post_message(HistoryLoaded(results))

    @on(HistoryLoaded)
    def _loaded(self, message: HistoryLoaded) -> None:
        with self.app.batch_update():
            for name, result in message.results.items():
                error = self.query_one(f"#{name}-error", Static)
                table = self.query_one(f"#{name}", DataTable)
                if isinstance(result, str):
                    error.update(f"✖ {name}: {result}")
                    error.display = True
                    continue
                error.display = False
                ensure_columns(table, [(c, c) for c in result["columns"]])
                rows = {f"r{i}": [fmt_cell(v) for v in row] for i, row in enumerate(result["rows"])}
                sync_rows(table, rows, keep_order=True)
                if not rows:
                    error.update(f"{name}: no rows yet (the store fills as requests are served)")
                    error.display = True
