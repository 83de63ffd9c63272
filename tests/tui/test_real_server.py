"""Acceptance: the dashboard against a real in-process tokenops server with real traffic.

``bundled`` runs the bundled engine on the default demo model (slow: model start-up);
``gateway`` runs the same gateway, admin API and store with the gateway's FakeBackend
(an MoE-like expert load included) so the default suite covers the wiring quickly.
"""

from __future__ import annotations

import json

import pytest
from pilot_wait import wait_until
from real_server import ADMIN_KEY, admin_get, running_server, send_traffic
from textual.widgets import DataTable, Input

from tokenops.tui.app import DashboardApp
from tokenops.tui.client import AdminClient
from tokenops.tui.format import fmt_float, fmt_int, fmt_pct, fmt_seconds
from tokenops.tui.screens.engine import replica_cells
from tokenops.tui.screens.models import model_cells
from tokenops.tui.widgets.expert_heatmap import ExpertHeatmap, expert_matrix
from tokenops.tui.widgets.line_chart import LineChart
from tokenops.tui.widgets.metric_tile import MetricTile
from tokenops.tui.widgets.tunable_editor import TunableEditor

NUM_REQUESTS = 6


@pytest.fixture(scope="module", params=["gateway", pytest.param("bundled", marks=pytest.mark.slow)])
def server(request, tmp_path_factory):
    backends = None
    if request.param == "gateway":
        from tokenops.testing_gateway import FakeBackend

        backends = [FakeBackend(model="fake-moe", expert_load=True, delay_s=0.002)]
    else:
        pytest.importorskip("torch")
    with running_server(tmp_path_factory.mktemp(f"store-{request.param}"), backends) as url:
        send_traffic(url, NUM_REQUESTS)
        yield {"url": url, "kind": request.param}


def _counters(stats):
    """Everything in a snapshot that cannot change while the server is idle."""
    return {
        "requests": (stats["requests"]["total"], stats["requests"]["errors"]),
        "tokens": (stats["tokens"]["total_input"], stats["tokens"]["total_output"]),
        "models": {n: (m["requests"], m["input_tokens"], m["output_tokens"], m["cost_usd"]) for n, m in stats["models"].items()},
        # token engines only: the default model list also serves embeddings and images, whose stats differ
        "engines": {n: (e["total_prompt_tokens"], e["total_generation_tokens"], e["num_steps"], e["expert_load"])
                    for n, e in stats["engines"].items() if "total_prompt_tokens" in e},
        "routes": stats["routes"],
    }


async def test_numbers_shown_equal_admin_stats(server):
    url = server["url"]
    client = AdminClient(url, ADMIN_KEY)
    app = DashboardApp(client, poll_interval_s=0.3, max_backoff_s=1.0)
    async with app.run_test(size=(140, 36)) as pilot:
        await wait_until(pilot, lambda: app.last_stats is not None and app.last_stats["requests"]["total"] >= NUM_REQUESTS, timeout_s=30, what="stats with the traffic")
        await pilot.press("p")  # freeze: what is on screen is app.last_stats
        await pilot.pause(0.6)
        stats = app.last_stats
        assert stats["requests"]["total"] == NUM_REQUESTS
        assert _counters(admin_get(url, "/admin/stats")) == _counters(stats)

        tile = lambda i: app.screen.query_one(f"#{i}", MetricTile).value_text  # noqa: E731
        assert tile("rps") == fmt_float(stats["requests"]["rate_rps"], 2)
        assert tile("input_tps") == fmt_float(stats["tokens"]["input_tps"])
        assert tile("output_tps") == fmt_float(stats["tokens"]["output_tps"])
        assert tile("errors").startswith(fmt_int(stats["requests"]["errors"]))
        assert tile("attainment") == fmt_pct(stats["slo"]["attainment"])
        text = app.screen_text()
        for target in stats["slo"]["targets"]:
            assert f"{target['label']}: {fmt_seconds(target['value_s'])} / {fmt_seconds(target['threshold_s'])}" in text

        def latest(key):
            return next((p[key] for p in reversed(stats["history"]) if p.get(key) is not None), None)

        for chart, series in (("tps", (("in", "input_tps"), ("out", "output_tps"))), ("ttft", (("p50", "ttft_p50"), ("p95", "ttft_p95"))), ("e2e", (("p50", "e2e_p50"), ("p95", "e2e_p95")))):
            legend = app.screen.query_one(f"#chart-{chart}", LineChart).legend().plain
            fmt = fmt_float if chart == "tps" else fmt_seconds
            for label, key in series:
                assert f"{label} {fmt(latest(key))}" in legend, (chart, label, legend)

        await pilot.press("2")
        table = app.screen.query_one("#replicas", DataTable)
        await wait_until(pilot, lambda: table.row_count == len(stats["engines"]), what="engine rows")
        for name, engine in stats["engines"].items():
            breaker = (stats.get("breakers") or {}).get(name)
            assert [str(c) for c in table.get_row(name)] == [str(c) for c in replica_cells(name, engine, breaker)]

        await pilot.press("3")
        models = app.screen.query_one("#models", DataTable)
        await wait_until(pilot, lambda: models.row_count == len(stats["models"]), what="model rows")
        for name, model in stats["models"].items():
            row = [str(c) for c in models.get_row(name)]
            assert row == [str(c) for c in model_cells(name, model)]
            assert row[2] == fmt_int(model["requests"])
        assert sum(model["requests"] for model in stats["models"].values()) == NUM_REQUESTS

        await pilot.press("4")
        await pilot.pause(0.2)
        matrices = {n: expert_matrix(e.get("expert_load")) for n, e in stats["engines"].items()}
        heatmaps = {h.name: h.matrix for h in app.screen.query(ExpertHeatmap)}
        assert heatmaps == {n: m for n, m in matrices.items() if m}
        if not heatmaps:
            assert "No MoE model" in app.screen_text()
        plans = {n: e["eplb"] for n, e in stats["engines"].items() if e.get("eplb")}
        loaded = {n for n, m in heatmaps.items() if any(any(row) for row in m)}
        assert set(plans) == loaded  # every MoE replica with load gets an EPLB plan (an idle one has none)
        text = app.screen_text()
        for name, plan in plans.items():
            assert f"{name} · EPLB plan" in text and str(plan["devices"]) in text

        await pilot.press("6")
        usage = app.screen.query_one("#usage_by_model_day", DataTable)
        await wait_until(pilot, lambda: usage.row_count > 0, what="usage rows")
        result = admin_get(url, "/admin/query/usage_by_model_day")
        requests_col = result["columns"].index("requests")
        shown = [str(c) for c in usage.get_row("r0")]
        assert shown[requests_col] == str(result["rows"][0][requests_col])
    client.close()


async def test_editing_a_tunable_applies_it_on_the_server_and_records_it(server):
    url = server["url"]
    before = {t["name"]: t["value"] for t in admin_get(url, "/admin/tunables")["tunables"]}
    old, new = before["engine.max_num_seqs"], before["engine.max_num_seqs"] // 2 + 1
    client = AdminClient(url, ADMIN_KEY)
    app = DashboardApp(client, poll_interval_s=1.0)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("5")
        table = app.screen.query_one("#tunables", DataTable)
        await wait_until(pilot, lambda: table.row_count == len(before), what="tunables")
        assert table.get_row("engine.max_num_seqs")[1] == str(old)
        table.move_cursor(row=table.get_row_index("engine.max_num_seqs"))
        table.focus()
        await pilot.press("enter")
        editor = app.screen.query_one(TunableEditor)
        app.screen.query_one(Input).value = str(new)
        await pilot.press("enter")
        await wait_until(pilot, lambda: "applied" in editor.status_text, timeout_s=30, what="applied")

        after = {t["name"]: t["value"] for t in admin_get(url, "/admin/tunables")["tunables"]}
        assert after["engine.max_num_seqs"] == new
        changes = admin_get(url, "/admin/query/config_changes")
        rows = [dict(zip(changes["columns"], r)) for r in changes["rows"]]
        mine = [r for r in rows if r["name"] == "engine.max_num_seqs" and r["actor"] == "dashboard"]
        assert mine and json.loads(str(mine[0]["new_value"])) == new and json.loads(str(mine[0]["old_value"])) == old
        await wait_until(pilot, lambda: table.get_row("engine.max_num_seqs")[1] == str(new), what="table refresh")
        changes_table = app.screen.query_one("#changes", DataTable)
        await wait_until(pilot, lambda: changes_table.row_count == len(rows), what="change history")

        # Revert the newest change from the history: the old value goes back.
        newest = next(i for i, r in enumerate(rows) if r is mine[0])
        changes_table.focus()
        changes_table.move_cursor(row=newest)
        await pilot.press("r")
        await wait_until(pilot, lambda: {t["name"]: t["value"] for t in admin_get(url, "/admin/tunables")["tunables"]}["engine.max_num_seqs"] == old, timeout_s=30, what="revert on the server")

        # A restart-only tunable: the server refuses and the screen says why.
        table.move_cursor(row=table.get_row_index("engine.kv_cache_tokens"))
        table.focus()
        await pilot.press("enter")
        app.screen.query_one(Input).value = "2048"
        await pilot.press("enter")
        await wait_until(pilot, lambda: "rejected by server" in editor.status_text, timeout_s=30, what="rejection")
        assert "restart" in editor.status_text
    client.close()


@pytest.mark.slow
async def test_experts_screen_on_a_bundled_moe_model(tmp_path):
    """A tiny random Mixtral on the bundled engine: the heatmap is the server's expert load."""
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
    from tiny_models import make_tiny_checkpoint

    from tokenops.config import EngineSettings, GatewaySettings, ModelConfig, Settings, StoreSettings

    model_dir = make_tiny_checkpoint("mixtral", tmp_path / "models")
    settings = Settings(
        models=[ModelConfig(name="tiny-mixtral", backend="local", path=str(model_dir))],
        gateway=GatewaySettings(admin_key=ADMIN_KEY),
        store=StoreSettings(path=str(tmp_path / "tokenops.duckdb")),
        engine=EngineSettings(kv_cache_tokens=512, max_num_seqs=4, max_num_batched_tokens=128, torch_threads=1),
    )
    with running_server(tmp_path, settings=settings) as url:
        send_traffic(url, 3, max_tokens=4)
        client = AdminClient(url, ADMIN_KEY)
        app = DashboardApp(client, poll_interval_s=0.3)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: app.last_stats is not None and app.last_stats["requests"]["total"] >= 3, timeout_s=30)
            await pilot.press("p")
            await pilot.pause(0.6)
            await pilot.press("4")
            await wait_until(pilot, lambda: bool(app.screen.query(ExpertHeatmap)), what="heatmap")
            stats = app.last_stats
            (name, engine), = stats["engines"].items()
            heatmap = app.screen.query_one(ExpertHeatmap)
            assert heatmap.matrix == expert_matrix(engine["expert_load"])
            assert len(heatmap.matrix) >= 1 and len(heatmap.matrix[0]) == 4  # tiny Mixtral: 4 experts per layer
            assert sum(map(sum, heatmap.matrix)) > 0
            assert admin_get(url, "/admin/stats")["engines"][name]["expert_load"] == engine["expert_load"]
        client.close()


async def test_wrong_admin_key_is_a_clear_error_state(server):
    client = AdminClient(server["url"], "not-the-key")
    app = DashboardApp(client, poll_interval_s=0.1, max_backoff_s=0.2)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: app.connection.num_failures >= 2, what="failed polls")
        assert app.connection.status == "error" and app.last_stats is None
        text = app.screen_text()
        assert "✖ server error · retry #" in text
        assert "admin key" in app.connection.error.lower()
    client.close()
