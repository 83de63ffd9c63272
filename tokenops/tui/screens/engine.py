"""Engine: per replica running/waiting, batch tokens, KV usage, prefix hits, preemptions, spec decode."""

from __future__ import annotations

from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import DataTable

from tokenops.tui.bars import usage_bar
from tokenops.tui.format import fmt_float, fmt_int, fmt_pct, ratio
from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.tables import ensure_columns, sync_rows
from tokenops.tui.widgets.line_chart import LineChart

COLUMNS = (
    ("replica", "replica"),
    ("model", "model"),
    ("breaker", "breaker"),
    ("running", "run"),
    ("waiting", "wait"),
    ("batch", "batch tok"),
    ("kv", "KV cache"),
    ("prefix", "prefix hit"),
    ("preempt", "preempt"),
    ("step", "step ms"),
    ("spec", "spec accept"),
)


def spec_acceptance(spec: dict[str, Any] | None) -> float | None:
    """Acceptance rate of speculative decoding from an engine's ``spec_decode`` stats, if any."""
    if not spec:
        return None
    if spec.get("acceptance_rate") is not None:
        return float(spec["acceptance_rate"])
    accepted = next((v for k, v in spec.items() if "accept" in k and isinstance(v, (int, float))), None)
    proposed = next(
        (v for k, v in spec.items() if ("draft" in k or "propos" in k) and isinstance(v, (int, float))), None
    )
    return ratio(accepted, proposed)


def replica_cells(name: str, engine: dict[str, Any], breaker: str | None = None) -> list[Any]:
    """The Engine table row of one replica, in :data:`COLUMNS` order (``breaker``: its
    circuit-breaker state from ``/admin/stats`` ``breakers``, when a breaker is on)."""
    step = engine.get("last_step_time_s")
    return [
        name,
        str(engine.get("model") or "–"),
        (breaker or "–").replace("_", "-"),
        fmt_int(engine.get("num_running")),
        fmt_int(engine.get("num_waiting")),
        fmt_int(engine.get("last_batch_tokens")),
        usage_bar(engine.get("kv_cache_usage")),
        fmt_pct(ratio(engine.get("prefix_cache_hits"), engine.get("prefix_cache_queries"))),
        fmt_int(engine.get("num_preemptions")),
        fmt_float(None if step is None else step * 1000, 1),
        fmt_pct(spec_acceptance(engine.get("spec_decode"))),
    ]


class EngineScreen(DashboardScreen):
    SCREEN_TITLE = "Engine"

    def __init__(self) -> None:
        super().__init__()
        self._selected: str | None = None

    def compose_body(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="replicas", cursor_type="row", zebra_stripes=True)
        table.border_title = "replicas"
        yield table
        with Horizontal(id="engine-charts"):
            yield LineChart("batch tokens/step", fmt_int, id="chart-batch")
            yield LineChart("KV cache usage", fmt_pct, id="chart-kv")

    def on_mount(self) -> None:
        ensure_columns(self.query_one("#replicas", DataTable), COLUMNS)

    def show_stats(self, stats: dict[str, Any]) -> None:
        engines = stats.get("engines") or {}
        table = self.query_one("#replicas", DataTable)
        ensure_columns(table, COLUMNS)
        with self.app.batch_update():
            breakers = stats.get("breakers") or {}
            sync_rows(
                table,
                {name: replica_cells(name, engine, breakers.get(name)) for name, engine in sorted(engines.items())},
            )
            if self._selected not in engines:
                self._selected = next(iter(sorted(engines)), None)
            self._show_charts()

    def _show_charts(self) -> None:
        samples = list(self.app.engine_history.get(self._selected or "", ()))
        label = self._selected or "–"
        self.query_one("#chart-batch", LineChart).set_series([(label, [s[0] for s in samples], "cyan")])
        self.query_one("#chart-kv", LineChart).set_series([(label, [s[1] for s in samples], "magenta")])

    @on(DataTable.RowHighlighted, "#replicas")
    def _replica_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self._selected = event.row_key.value
            self._show_charts()
