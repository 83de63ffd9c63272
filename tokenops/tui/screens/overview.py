"""Overview: throughput, latency percentiles over time, SLO attainment, errors."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, Horizontal
from textual.widgets import Static

from tokenops.tui.format import fmt_float, fmt_int, fmt_pct, fmt_seconds
from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.widgets.line_chart import LineChart
from tokenops.tui.widgets.metric_tile import MetricTile

#: (chart id, title, history keys with labels and colours)
_LATENCY_CHARTS = (
    ("ttft", "TTFT", "ttft"),
    ("tpot", "TPOT", "tpot"),
    ("e2e", "E2E latency", "e2e"),
)


def slo_lines(slo: dict[str, Any]) -> Text:
    """One line per SLO target: value against threshold, ✓ / ✗ / – (no data)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    targets = slo.get("targets") or []
    if not targets:
        text.append("no SLO configured ([slo] targets in tokenops.toml)", style="dim")
    for i, target in enumerate(targets):
        met = target.get("met")
        mark, style = ("✓", "green") if met else ("–", "dim") if met is None else ("✗", "bold red")
        if i:
            text.append("\n")
        text.append(f"{mark} ", style=style)
        text.append(f"{target['label']}: {fmt_seconds(target.get('value_s'))} / {fmt_seconds(target['threshold_s'])}")
    return text


class OverviewScreen(DashboardScreen):
    SCREEN_TITLE = "Overview"

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="tiles"):
            yield MetricTile("req/s", id="rps")
            yield MetricTile("in tok/s", id="input_tps")
            yield MetricTile("out tok/s", id="output_tps")
            yield MetricTile("in flight", id="in_flight")
            yield MetricTile("errors", id="errors")
            yield MetricTile("SLO met", id="attainment")
        with Grid(id="charts"):
            yield LineChart("requests/s", lambda v: fmt_float(v, 2), id="chart-rps")
            yield LineChart("tokens/s", fmt_float, id="chart-tps")
            for chart_id, title, _ in _LATENCY_CHARTS:
                yield LineChart(f"{title} p50/p95", fmt_seconds, id=f"chart-{chart_id}")
            slo = Static(id="slo")
            slo.border_title = "SLO"
            yield slo

    def show_stats(self, stats: dict[str, Any]) -> None:
        requests, tokens, slo = stats["requests"], stats["tokens"], stats.get("slo") or {}
        history = stats.get("history") or []
        attainment = slo.get("attainment")
        with self.app.batch_update():
            self.query_one("#rps", MetricTile).show(fmt_float(requests["rate_rps"], 2))
            self.query_one("#input_tps", MetricTile).show(fmt_float(tokens["input_tps"]))
            self.query_one("#output_tps", MetricTile).show(fmt_float(tokens["output_tps"]))
            self.query_one("#in_flight", MetricTile).show(fmt_int(requests["in_flight"]))
            self.query_one("#errors", MetricTile).show(
                f"{fmt_int(requests['errors'])} ({fmt_pct(requests['error_rate'])})",
                is_good=None if not requests["errors"] else False,
            )
            self.query_one("#attainment", MetricTile).show(
                fmt_pct(attainment), is_good=None if attainment is None else attainment >= 0.99
            )
            column = lambda key: [point.get(key) for point in history]  # noqa: E731
            self.query_one("#chart-rps", LineChart).set_series(
                [("req/s", column("rps"), "cyan"), ("err", column("errors"), "red")]
            )
            self.query_one("#chart-tps", LineChart).set_series(
                [("in", column("input_tps"), "magenta"), ("out", column("output_tps"), "green")]
            )
            for chart_id, _, key in _LATENCY_CHARTS:
                self.query_one(f"#chart-{chart_id}", LineChart).set_series(
                    [("p50", column(f"{key}_p50"), "green"), ("p95", column(f"{key}_p95"), "yellow")]
                )
            self.query_one("#slo", Static).update(slo_lines(slo))
