"""The dashboard driven by Pilot against the in-memory fake admin API (fast)."""

from __future__ import annotations

import threading
import time

from pilot_wait import wait_until
from fake_admin import FakeAdminClient, make_stats
from textual.widgets import DataTable, Input

from tokenops.tui.app import DashboardApp
from tokenops.tui.format import fmt_float, fmt_int, fmt_pct, fmt_seconds
from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.screens.engine import replica_cells
from tokenops.tui.screens.models import model_cells
from tokenops.tui.widgets.connection_banner import ConnectionBanner
from tokenops.tui.widgets.expert_heatmap import ExpertHeatmap, imbalance
from tokenops.tui.widgets.line_chart import LineChart
from tokenops.tui.widgets.metric_tile import MetricTile
from tokenops.tui.widgets.tunable_editor import TunableEditor


def _app(client, interval: float = 0.05) -> DashboardApp:
    return DashboardApp(client, poll_interval_s=interval, max_backoff_s=max(interval, 0.4))


async def test_overview_shows_the_snapshot(fake_client):
    app = _app(fake_client)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.last_stats is not None, what="first stats")
        stats = app.last_stats
        tile = lambda i: app.screen.query_one(f"#{i}", MetricTile).value_text  # noqa: E731
        assert tile("rps") == fmt_float(stats["requests"]["rate_rps"], 2) == "6.25"
        assert tile("input_tps") == fmt_float(stats["tokens"]["input_tps"])
        assert tile("output_tps") == fmt_float(stats["tokens"]["output_tps"])
        assert tile("in_flight") == str(stats["requests"]["in_flight"])
        assert tile("attainment") == fmt_pct(stats["slo"]["attainment"]) == "93.4%"
        legend = app.screen.query_one("#chart-ttft", LineChart).legend().plain
        assert fmt_seconds(stats["history"][-1]["ttft_p95"]) in legend
        text = app.screen_text()
        assert "✗ tpot p95<=30ms: 52.5 ms / 30.0 ms" in text
        assert "12 (0.2%)" in text


async def test_engine_and_models_tables_match_stats(fake_client):
    app = _app(fake_client)
    async with app.run_test(size=(140, 30)) as pilot:
        await wait_until(pilot, lambda: app.last_stats is not None, what="first stats")
        await pilot.press("2")
        await wait_until(pilot, lambda: app.current_mode == "engine" and app.screen.query_one(DataTable).row_count == 2)
        stats = app.last_stats
        table = app.screen.query_one("#replicas", DataTable)
        for name, engine in stats["engines"].items():
            row = table.get_row(name)
            assert [str(c) for c in row] == [str(c) for c in replica_cells(name, engine, stats["breakers"][name])]
            assert row[3] == str(engine["num_running"]) and row[4] == str(engine["num_waiting"])
            assert row[2] == stats["breakers"][name].replace("_", "-")
        assert str(table.get_row("local-0")[-1]) == "72.5%"  # 2900 accepted / 4000 drafted
        await pilot.press("3")
        await wait_until(pilot, lambda: app.current_mode == "models" and app.screen.query_one("#models", DataTable).row_count == 2)
        models = app.screen.query_one("#models", DataTable)
        for name, model in stats["models"].items():
            assert [str(c) for c in models.get_row(name)] == [str(c) for c in model_cells(name, model)]
        routes = app.screen.query_one("#routes", DataTable)
        assert routes.get_row("default")[1] == fmt_int(stats["routes"]["default"])
        assert "1,456" in app.screen_text()  # escalations


async def test_experts_heatmap_and_no_moe_state():
    app = _app(FakeAdminClient())
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.last_stats is not None)
        await pilot.press("4")
        await wait_until(pilot, lambda: bool(app.screen.query(ExpertHeatmap)))
        heatmap = app.screen.query_one(ExpertHeatmap)
        load = app.last_stats["engines"]["local-0"]["expert_load"]
        assert len(heatmap.matrix) == len(load)
        lines = heatmap.render().plain.splitlines()[1:]
        for row, line in zip(load, lines):
            assert line.rstrip().endswith(f"{imbalance(row):.2f}")
        assert "EPLB plan" in app.screen_text()
    app = _app(FakeAdminClient(make_stats(moe=False)))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.last_stats is not None)
        await pilot.press("4")
        await pilot.pause(0.1)
        assert "No MoE model" in app.screen_text()
        assert not app.screen.query(ExpertHeatmap)


async def test_edit_tunable_applies_and_records_then_reverts(fake_client):
    app = _app(fake_client, interval=0.5)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("5")
        table = app.screen.query_one("#tunables", DataTable)
        await wait_until(pilot, lambda: table.row_count == 6, what="tunables")
        table.move_cursor(row=table.get_row_index("engine.max_num_seqs"))
        table.focus()
        await pilot.press("enter")
        editor = app.screen.query_one(TunableEditor)
        field = app.screen.query_one(Input)
        assert field.has_focus and field.value == "32"
        field.value = "64"
        await pilot.press("enter")
        await wait_until(pilot, lambda: "applied" in editor.status_text, what="applied")
        assert fake_client.values["engine.max_num_seqs"] == 64
        changes = app.screen.query_one("#changes", DataTable)
        await wait_until(pilot, lambda: changes.row_count == 1, what="change history")
        assert table.get_row("engine.max_num_seqs")[1] == "64"
        assert [str(c) for c in changes.get_row("c0")][1:4] == ["engine.max_num_seqs", "32", "64"]
        changes.focus()
        await pilot.press("r")
        await wait_until(pilot, lambda: fake_client.values["engine.max_num_seqs"] == 32, what="revert")
        await wait_until(pilot, lambda: changes.row_count == 2)
        assert fake_client.changes[0][1:5] == ["engine.max_num_seqs", "64", "32", "dashboard"]


async def test_rejected_edits_are_shown(fake_client):
    app = _app(fake_client, interval=0.5)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("5")
        table = app.screen.query_one("#tunables", DataTable)
        await wait_until(pilot, lambda: table.row_count == 6)
        editor = app.screen.query_one(TunableEditor)
        # Client-side: the registry's own rules, nothing is sent.
        table.move_cursor(row=table.get_row_index("engine.schedule_policy"))
        table.focus()
        await pilot.press("enter")
        app.screen.query_one(Input).value = "lifo"
        await pilot.press("enter")
        assert "rejected by validation" in editor.status_text and "not one of" in editor.status_text
        assert editor.has_class("-rejected") and not fake_client.changes
        # Server-side: restart-only tunables are refused by the server, whose reason is shown.
        table.move_cursor(row=table.get_row_index("engine.kv_cache_tokens"))
        table.focus()
        await pilot.press("enter")
        app.screen.query_one(Input).value = "4096"
        await pilot.press("enter")
        await wait_until(pilot, lambda: "rejected by server" in editor.status_text)
        assert "needs a restart" in editor.status_text
        assert fake_client.values["engine.kv_cache_tokens"] == 16384


async def test_history_tables(fake_client):
    app = _app(fake_client, interval=0.5)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("6")
        usage = app.screen.query_one("#usage_by_model_day", DataTable)
        latency = app.screen.query_one("#latency_by_model_hour", DataTable)
        await wait_until(pilot, lambda: usage.row_count == 3 and latency.row_count == 2)
        expected = fake_client.query("usage_by_model_day")
        assert [c.value for c in usage.columns] == expected["columns"]
        assert usage.get_row("r1")[:3] == ["2025-11-20", "demo-moe", "5000"]


async def test_unreachable_server_banner_backoff_and_recovery(fake_client):
    fake_client.is_down = True
    app = DashboardApp(fake_client, poll_interval_s=0.05, max_backoff_s=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.connection.num_failures >= 4, what="failures")
        banner = app.screen.query_one(ConnectionBanner)
        assert banner.has_class("-down")
        text = app.screen_text()
        assert "✖ server unreachable · retry #" in text and "in 0.2s · http://fake:8000: ConnectError" in text
        assert app.connection.retry_in_s == 0.2  # capped backoff
        calls = fake_client.num_stats_calls
        await pilot.pause(0.5)
        assert fake_client.num_stats_calls - calls <= 4  # backoff: at most one try per 0.2 s
        fake_client.is_down = False
        await wait_until(pilot, lambda: app.connection.is_connected, what="reconnect")
        assert banner.has_class("-connected") and app.last_stats is not None


class _BlockingClient(FakeAdminClient):
    """stats() blocks until released, and counts how many polls overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.active = 0
        self.max_active = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def stats(self):
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.entered.set()
        self.release.wait(20)
        time.sleep(0.05)
        with self._lock:
            self.active -= 1
        return super().stats()


async def test_polls_never_overlap_and_ui_stays_responsive():
    client = _BlockingClient()
    app = DashboardApp(client, poll_interval_s=0.01, max_backoff_s=0.1)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, client.entered.is_set, what="first poll to start")
        await pilot.press("2")  # while the poll blocks in its thread
        await pilot.press("3")
        await wait_until(pilot, lambda: app.current_mode == "models", what="screen switch")
        assert client.active == 1 and app.num_polls == 0  # the UI moved on while the poll is still blocked
        assert "connecting to http://fake:8000" in app.screen_text()
        client.release.set()
        await wait_until(pilot, lambda: app.num_polls >= 5, what="five polls")
        assert client.max_active == 1


async def test_pause_stops_polling(fake_client):
    app = _app(fake_client)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.num_polls >= 2)
        await pilot.press("p")
        await pilot.pause(0.1)
        polls = fake_client.num_stats_calls
        await pilot.pause(0.3)
        assert fake_client.num_stats_calls == polls
        assert "[paused]" in app.screen_text()
        await pilot.press("p")
        await wait_until(pilot, lambda: fake_client.num_stats_calls > polls)
        assert isinstance(app.screen, DashboardScreen)
