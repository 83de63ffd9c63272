"""Pure helpers and widgets of the dashboard: formatting, charts, heatmap maths, keyed tables."""

from __future__ import annotations

import pytest
from textual.app import App
from textual.widgets import DataTable

from tokenops.tui.format import fmt_pct, fmt_seconds, fmt_usd
from tokenops.tui.screens.engine import spec_acceptance
from tokenops.tui.screens.tuning import parse_stored
from tokenops.tui.tables import ensure_columns, sync_rows
from tokenops.tui.widgets.expert_heatmap import expert_matrix, imbalance
from tokenops.tui.widgets.line_chart import LineChart
from tokenops.tui.widgets.tunable_editor import describe_range, tunable_from_dict
from tokenops.tunables import Tunable, TunableError


def test_formats():
    assert fmt_seconds(0.0125) == "12.5 ms"
    assert fmt_seconds(2.5) == "2.50 s"
    assert fmt_seconds(None) == "–"
    assert fmt_pct(0.934) == "93.4%"
    assert fmt_usd(0.5) == "$0.5000" and fmt_usd(12.345) == "$12.35"


def test_expert_matrix_and_imbalance():
    assert expert_matrix(None) is None and expert_matrix([]) is None
    assert expert_matrix([[1, 2], [3, 4]]) == [[1.0, 2.0], [3.0, 4.0]]
    assert expert_matrix({"1": [3, 4], "0": [1, 2]}) == [[1.0, 2.0], [3.0, 4.0]]
    assert expert_matrix({"layers": [[5, 5]]}) == [[5.0, 5.0]]
    assert imbalance([10, 10, 10, 10]) == pytest.approx(1.0)
    assert imbalance([40, 0, 0, 0]) == pytest.approx(4.0)
    assert imbalance([0, 0]) is None


def test_spec_acceptance_variants():
    assert spec_acceptance(None) is None
    assert spec_acceptance({"acceptance_rate": 0.7}) == 0.7
    assert spec_acceptance({"num_draft_tokens": 400, "num_accepted_tokens": 300}) == pytest.approx(0.75)
    assert spec_acceptance({"num_draft_tokens": 0, "num_accepted_tokens": 0}) is None


def test_tunable_round_trip_and_range():
    t = Tunable("engine.max_num_seqs", "int", 32, "help", live=True, minimum=1, maximum=512)
    data = {**t.to_dict(), "value": 32}
    rebuilt = tunable_from_dict(data)
    assert rebuilt.validate("64") == 64
    with pytest.raises(TunableError, match="above the maximum"):
        rebuilt.validate("9999")
    assert describe_range(data) == "1..512"
    assert describe_range({"type": "str", "choices": ["a", "b"]}) == "a|b"
    assert parse_stored("16") == 16 and parse_stored('"fcfs"') == "fcfs" and parse_stored("fcfs") == "fcfs"


class _TableApp(App):
    def compose(self):
        yield DataTable()


async def test_sync_rows_updates_by_key():
    app = _TableApp()
    async with app.run_test():
        table = app.query_one(DataTable)
        ensure_columns(table, [("a", "A"), ("b", "B")])
        sync_rows(table, {"x": ["1", "2"], "y": ["3", "4"]})
        first_key = next(iter(table.rows))
        sync_rows(table, {"x": ["1", "9"]})
        assert list(k.value for k in table.rows) == ["x"]
        assert next(iter(table.rows)) == first_key  # same row object, updated in place
        assert table.get_row("x") == ["1", "9"]


class _ChartApp(App):
    def compose(self):
        yield LineChart("t", lambda v: "–" if v is None else f"{v:.0f}")


async def test_line_chart_plots_rising_series_bottom_left_to_top_right():
    app = _ChartApp()
    async with app.run_test(size=(24, 8)):
        chart = app.query_one(LineChart)
        chart.set_series([("s", list(range(40)), "green")])
        await app.workers.wait_for_complete()
        rendered = chart.render().plain.splitlines()
        assert rendered[0].startswith("s 39") and "max 39" in rendered[0]
        rows = rendered[1:]
        assert rows[0].rstrip()[-1] != " " and rows[0][0] == " "  # top row: only the right end
        assert rows[-1][0] != " "  # bottom row starts at the left


async def test_sync_rows_keep_order_readds_when_a_row_is_prepended():
    app = _TableApp()
    async with app.run_test():
        table = app.query_one(DataTable)
        ensure_columns(table, [("a", "A")])
        sync_rows(table, {"id1": ["old"]}, keep_order=True)
        sync_rows(table, {"id2": ["new"], "id1": ["old"]}, keep_order=True)
        assert [k.value for k in table.rows] == ["id2", "id1"]
        assert [table.get_row_at(i)[0] for i in range(2)] == ["new", "old"]
