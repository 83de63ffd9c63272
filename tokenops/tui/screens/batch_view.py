"""Batches: every tenant's Batch API batches (status, progress, lines/s, generated tokens/s, ETA)
with the interactive traffic's TTFT p95 and SLO beside them, from ``GET /admin/batches``: does the
batch work run on idle capacity without hurting interactive requests?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable, Static

from tokenops.tui.bars import usage_bar
from tokenops.tui.client import AdminError
from tokenops.tui.format import fmt_float, fmt_int, fmt_seconds
from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.screens.overview import slo_lines
from tokenops.tui.tables import ensure_columns, sync_rows
from tokenops.tui.widgets.metric_tile import MetricTile

BATCH_COLUMNS = (
    ("id", "batch"),
    ("tenant", "tenant"),
    ("status", "status"),
    ("progress", "progress"),
    ("done", "done / total"),
    ("failed", "failed"),
    ("lines_s", "lines/s"),
    ("tokens_s", "tok/s"),
    ("eta", "ETA"),
)


@dataclass
class BatchesLoaded(Message):
    """``GET /admin/batches``'s answer, or ``error`` (the server's reason)."""

    view: dict[str, Any] | None
    error: str | None = None


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def batch_cells(batch: dict[str, Any]) -> list[Any]:
    counts = batch["request_counts"]
    return [
        batch["id"],
        batch["tenant"],
        batch["status"],
        usage_bar(batch.get("progress"), width=10, warn=2, danger=2),
        f"{fmt_int(counts['completed'] + counts['failed'])} / {fmt_int(counts['total'])}",
        fmt_int(counts["failed"]),
        fmt_float(batch.get("lines_per_s"), 2),
        fmt_float(batch.get("tokens_per_s")),
        fmt_eta(batch.get("eta_s")),
    ]


class BatchesScreen(DashboardScreen):
    SCREEN_TITLE = "Batches"
    DEFAULT_CSS = """
    BatchesScreen #batch-tiles { height: 2; margin: 1 0 0 0; }
    BatchesScreen #batch-slo { height: auto; max-height: 4; padding: 0 1; }
    BatchesScreen #batch-error { color: $error; padding: 0 1; }
    """

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="batch-tiles"):
            yield MetricTile("interactive TTFT p95", id="ttft_p95")
            yield MetricTile("interactive TPOT p95", id="tpot_p95")
            yield MetricTile("batch tok/s", id="batch_tps")
            yield MetricTile("batch lines running", id="lines_running")
        yield Static("", id="batch-slo")
        yield Static("", id="batch-error")
        table: DataTable[Any] = DataTable(id="batches", cursor_type="row", zebra_stripes=True)
        table.border_title = "batches (every tenant; running ones first)"
        yield table

    def on_mount(self) -> None:
        ensure_columns(self.query_one("#batches", DataTable), BATCH_COLUMNS)

    def show_stats(self, stats: dict[str, Any]) -> None:
        self.load()  # every stats poll: the app's one-shot timer paces this view too

    @work(thread=True, exclusive=True, group="batches-load")
    def load(self) -> None:
        try:
            self.post_message(BatchesLoaded(self.app.client.batches()))
        except AdminError as e:
            self.post_message(BatchesLoaded(None, e.message))

    @on(BatchesLoaded)
    def _loaded(self, message: BatchesLoaded) -> None:
        error = self.query_one("#batch-error", Static)
        error.display = message.error is not None
        if message.view is None:
            error.update(f"✖ /admin/batches: {message.error}")
            return
        view = message.view
        inter = view["interactive"]
        with self.app.batch_update():
            tile = lambda name: self.query_one(f"#{name}", MetricTile)  # noqa: E731
            met = [t["met"] for t in inter["slo"] if t["metric"] == "ttft" and t["met"] is not None]
            tile("ttft_p95").show(fmt_seconds(inter["ttft_p95_s"]), all(met) if met else None)
            tile("tpot_p95").show(fmt_seconds(inter["tpot_p95_s"]))
            tile("batch_tps").show(fmt_float(view["tokens_per_s"]))
            tile("lines_running").show(fmt_int(view["lines_running"]))
            slo = slo_lines({"targets": inter["slo"]})
            slo.append(f"\n(interactive requests only: {inter['num_requests']} in the last {inter['window_s']:.0f} s)")
            self.query_one("#batch-slo", Static).update(slo)
            rows = {b["id"]: batch_cells(b) for b in view["batches"]}
            sync_rows(self.query_one("#batches", DataTable), rows, keep_order=True)
