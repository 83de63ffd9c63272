"""The dashboard's batch view (key ``b``) driven by Pilot against the in-memory fake admin API."""

from __future__ import annotations

from fake_admin import FakeAdminClient
from pilot_wait import wait_until
from textual.widgets import DataTable, Static
from tokenops.tui.app import DashboardApp
from tokenops.tui.client import AdminError
from tokenops.tui.screens.batch_view import batch_cells, fmt_eta
from tokenops.tui.widgets.metric_tile import MetricTile


def _app(client) -> DashboardApp:
    return DashboardApp(client, poll_interval_s=0.05, max_backoff_s=0.4)


async def test_batch_view_lists_batches_beside_interactive_latency(fake_client):
    app = _app(fake_client)
    async with app.run_test(size=(140, 30)) as pilot:
        await wait_until(pilot, lambda: app.last_stats is not None, what="first stats")
        await pilot.press("b")
        await wait_until(
            pilot,
            lambda: app.current_mode == "batches" and app.screen.query_one("#batches", DataTable).row_count == 2,
            what="the batch rows",
        )
        table = app.screen.query_one("#batches", DataTable)
        view = fake_client.batches_view
        assert [str(c) for c in table.get_row("batch_running")] == [str(c) for c in batch_cells(view["batches"][0])]
        running = [str(c) for c in table.get_row("batch_running")]
        assert running[2] == "in_progress" and running[4] == "500 / 2,000" and running[5] == "20"
        assert running[6:] == ["2.50", "161.3", "10m00s"]
        assert [str(c) for c in table.get_row("batch_done")][-3:] == ["–", "–", "–"]  # not running: no rate, no ETA
        tile = lambda i: app.screen.query_one(f"#{i}", MetricTile)  # noqa: E731
        assert tile("ttft_p95").value_text == "234.5 ms" and tile("ttft_p95").has_class("-good")
        assert tile("batch_tps").value_text == "161.3" and tile("lines_running").value_text == "16"
        text = app.screen_text()
        assert "✓ ttft p95<=500ms: 234.5 ms / 500.0 ms" in text
        assert "interactive requests only: 42 in the last 60 s" in text

        # the next poll follows the server: a batch that finished moves on, a new SLO miss turns red
        view["batches"] = view["batches"][1:]
        view["interactive"]["slo"][0].update(value_s=0.9, met=False)
        view["interactive"]["ttft_p95_s"] = 0.9
        await wait_until(pilot, lambda: table.row_count == 1, what="the finished batch's row gone")
        await wait_until(pilot, lambda: tile("ttft_p95").has_class("-bad"), what="the SLO miss shown")


async def test_batch_view_says_why_it_is_empty():
    client = FakeAdminClient()

    def refuse():
        raise AdminError("This endpoint needs the admin key.", 401)

    client.batches = refuse
    app = _app(client)
    async with app.run_test(size=(120, 24)) as pilot:
        await pilot.press("b")
        error = lambda: app.screen.query_one("#batch-error", Static)  # noqa: E731
        await wait_until(pilot, lambda: app.current_mode == "batches" and error().display, what="the error line")
        assert "/admin/batches: This endpoint needs the admin key." in app.screen_text()


def test_eta_format():
    assert [fmt_eta(v) for v in (None, 0, 59.4, 61, 3600, 7325)] == ["–", "0s", "59s", "1m01s", "1h00m", "2h02m"]
