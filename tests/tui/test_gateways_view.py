"""The dashboard's gateways view (key ``g``) driven by Pilot against the in-memory fake admin API:
every replica of the service with its health, and the view following a replica that goes down."""

from __future__ import annotations

import time

from fake_admin import FakeAdminClient
from pilot_wait import wait_until
from textual.widgets import DataTable, Static
from tokenops.tui.app import DashboardApp
from tokenops.tui.client import AdminError
from tokenops.tui.screens.gateways_view import fmt_age, gateway_cells, summary


class GatewaysClient(FakeAdminClient):
    def __init__(self) -> None:
        super().__init__()
        now = time.time()
        self.view = [
            {"id": "gw-a:8000", "url": "http://10.0.0.11:8000", "pid": 11, "started_at": now - 3700, "seen_at": now,
             "phase": "serving", "ready": True, "in_flight": 3, "health": "up", "seen_s_ago": 0.0, "is_self": True},
            {"id": "gw-b:8000", "url": "http://10.0.0.12:8000", "pid": 12, "started_at": now - 65, "seen_at": now - 1,
             "phase": "serving", "ready": True, "in_flight": 7, "health": "up", "seen_s_ago": 1.2, "is_self": False},
            {"id": "gw-c:8000", "url": "http://10.0.0.13:8000", "pid": 13, "started_at": now - 30, "seen_at": now - 20,
             "phase": "stopped", "ready": False, "in_flight": 0, "health": "stopped", "seen_s_ago": 20.0,
             "is_self": False},
        ]

    def gateways(self):
        self._check()
        return {"gateways": self.view}


def _app(client) -> DashboardApp:
    return DashboardApp(client, poll_interval_s=0.05, max_backoff_s=0.4)


async def test_gateways_view_lists_replicas_with_their_health():
    client = GatewaysClient()
    app = _app(client)
    async with app.run_test(size=(150, 30)) as pilot:
        await wait_until(pilot, lambda: app.last_stats is not None, what="first stats")
        await pilot.press("g")
        table = lambda: app.screen.query_one("#gateways", DataTable)  # noqa: E731
        await wait_until(pilot, lambda: app.current_mode == "gateways" and table().row_count == 3, what="3 rows")
        a = [str(c) for c in table().get_row("gw-a:8000")]
        assert a[0] == "gw-a:8000 (this)" and a[1] == "http://10.0.0.11:8000" and "up" in a[2]
        assert a[3:7] == ["serving", "yes", "3", "now"] and a[7].startswith("1h01m")
        b = [str(c) for c in table().get_row("gw-b:8000")]
        assert b[5] == "7" and b[6] == "1s ago" and b[7].startswith("1m0")
        assert "stopped" in str(table().get_row("gw-c:8000")[2])
        assert "3 gateways: 2 up, 1 stopped" in app.screen_text()

        # B stops answering its heartbeat: the next poll shows it down
        client.view[1].update(health="down", seen_s_ago=9.0)
        await wait_until(pilot, lambda: "down" in str(table().get_row("gw-b:8000")[2]), what="B down")
        assert "3 gateways: 1 up, 1 down, 1 stopped" in app.screen_text()


async def test_gateways_view_says_why_it_is_empty():
    client = GatewaysClient()

    def refuse():
        raise AdminError("This endpoint needs the admin key.", 401)

    client.gateways = refuse
    app = _app(client)
    async with app.run_test(size=(120, 24)) as pilot:
        await pilot.press("g")
        error = lambda: app.screen.query_one("#gateways-error", Static)  # noqa: E731
        await wait_until(pilot, lambda: app.current_mode == "gateways" and error().display, what="the error line")
        assert "/admin/gateways: This endpoint needs the admin key." in app.screen_text()


def test_cells_and_summary():
    line = {"id": "x:1", "health": "down", "seen_s_ago": 75.0, "started_at": 1000.0, "in_flight": 1200, "ready": False}
    cells = gateway_cells(line, now=1000.0 + 7300)
    assert cells[0] == "x:1" and "down" in cells[2] and cells[4:] == ["no", "1,200", "1m15s ago", "2h01m"]
    assert summary([line]) == "1 gateway: 1 down"
    assert [fmt_age(v) for v in (None, 0, 59.9, 61)] == ["–", "0s", "59s", "1m01s"]
