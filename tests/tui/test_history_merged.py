"""The History screen over several gateway replicas' stores read as one (``tokenops dashboard
--history-store a --history-store b``), driven by Pilot: the day's requests of both replicas in one
row, image requests merged too, a missing store said on the screen; and the CLI flag wiring it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fake_admin import FakeAdminClient
from pilot_wait import wait_until
from textual.widgets import DataTable, Static
from typer.testing import CliRunner

from tokenops.cli import build_app
from tokenops.store import Store
from tokenops.tui.app import DashboardApp
from tokenops.tui.merged_history import MergedHistory


def _seed(path, replica: str, n: int, cost: float, images: int = 0) -> None:
    now = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=5)
    with Store.open(path) as store:
        writer = store.writer()
        writer.write_many("requests", [
            {"id": f"{replica}-{i}", "ts": now, "model_served": "tiny", "status": "ok", "tokens_in": 10,
             "tokens_out": 20, "cost_usd": cost, "ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": 1.0}
            for i in range(n)
        ])
        if images:
            writer.write_many("image_requests", [
                {"id": f"{replica}-img-{i}", "ts": now, "model": "sd-tiny", "sampler": "ddim", "num_images": 1,
                 "steps": 20, "deep_steps": 10, "cache_reuse_ratio": 0.5, "e2e_s": 2.0, "status": "ok"}
                for i in range(images)
            ])


def _cells(table: DataTable, column: str) -> list[str]:
    names = [str(c.label) for c in table.columns.values()]
    index = names.index(column)
    return [str(table.get_row_at(r)[index]) for r in range(table.row_count)]


async def test_history_screen_reads_every_replica_store_as_one(tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _seed(a, "a", 4, 0.25, images=2)
    _seed(b, "b", 6, 0.5, images=3)
    client = FakeAdminClient()  # the server's own /admin/query would answer demo rows: not read
    app = DashboardApp(client, poll_interval_s=0.05, max_backoff_s=0.4, history=MergedHistory([str(a), str(b)]))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("6")
        usage = lambda: app.screen.query_one("#usage_by_model_day", DataTable)  # noqa: E731
        await wait_until(pilot, lambda: app.current_mode == "history" and usage().row_count == 1, what="one row")
        assert _cells(usage(), "model") == ["tiny"] and _cells(usage(), "requests") == ["10"]
        assert "4" in _cells(usage(), "cost_usd")[0]  # 4 x 0.25 + 6 x 0.5
        latency = app.screen.query_one("#latency_by_model_hour", DataTable)
        assert _cells(latency, "requests") == ["10"]
        images = app.screen.query_one("#images_by_model_hour", DataTable)
        assert _cells(images, "requests") == ["5"] and _cells(images, "images") == ["5"]
        source = str(app.screen.query_one("#history-source", Static).render())
        assert "2 stores merged" in source and str(a) in source and str(b) in source


async def test_a_missing_replica_store_is_said_on_the_screen(tmp_path):
    a = tmp_path / "a.duckdb"
    _seed(a, "a", 2, 0.1)
    history = MergedHistory([str(a), str(tmp_path / "gone.duckdb")])
    app = DashboardApp(FakeAdminClient(), poll_interval_s=0.05, max_backoff_s=0.4, history=history)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("6")
        error = lambda: app.screen.query_one("#usage_by_model_day-error", Static)  # noqa: E731
        await wait_until(pilot, lambda: app.current_mode == "history" and error().display, what="the error")
        assert "no store at" in str(error().render()) and "gone.duckdb" in str(error().render())


def test_dashboard_flag_hands_the_stores_to_the_history_screen(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(DashboardApp, "run", lambda self: seen.update(paths=self.history.paths))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        build_app(), ["dashboard", "--history-store", "a.duckdb", "--history-store", "b.duckdb"],
        env={"TOKENOPS_URL": "http://10.0.0.5:8000", "TOKENOPS_ADMIN_KEY": "k1"},
    )
    assert result.exit_code == 0, result.output
    assert seen == {"paths": ["a.duckdb", "b.duckdb"]}
