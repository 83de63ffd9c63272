"""SVG snapshots of every screen with deterministic data from the fake admin client.

One poll only (the interval is an hour), Input cursors do not blink, and nothing on
screen reads the wall clock, so the pictures are stable. Update with
``pytest tests/tui/test_snapshots.py --snapshot-update`` after a deliberate change.
"""

from __future__ import annotations

import math
from collections import deque

import pytest
from pilot_wait import wait_until
from fake_admin import FakeAdminClient
from textual.widgets import DataTable, Input

from tokenops.tui.app import DashboardApp

HOUR = 3600.0


def _app(client: FakeAdminClient | None = None) -> DashboardApp:
    return DashboardApp(client or FakeAdminClient(), poll_interval_s=HOUR, max_backoff_s=HOUR)


def _seed_engine_history(app: DashboardApp) -> None:
    """Fill the Engine charts as if two minutes of polls had happened (deterministic)."""
    for name in ("local-0", "local-1"):
        samples = app.engine_history.setdefault(name, deque(maxlen=300))
        samples.clear()
        for i in range(120):
            samples.append((256 + 128 * math.sin(i / 9), 0.55 + 0.3 * math.sin(i / 23)))


def _before(keys: str = "", seed: bool = False):
    async def run_before(pilot) -> None:
        app = pilot.app
        await wait_until(pilot, lambda: app.last_stats is not None, what="first stats")
        if seed:
            _seed_engine_history(app)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.1)
        if app.current_mode in ("tuning", "history"):
            await wait_until(pilot, lambda: all(t.row_count for t in app.screen.query(DataTable) if t.id != "changes"))

    return run_before


@pytest.mark.parametrize(
    "key,mode",
    [("1", "overview"), ("2", "engine"), ("3", "models"), ("4", "experts"), ("5", "tuning"), ("6", "history")],
)
def test_screen_snapshot(snap_compare, key, mode):
    assert snap_compare(_app(), terminal_size=(100, 30), run_before=_before(key, seed=mode == "engine"))


def test_overview_at_80x24(snap_compare):
    assert snap_compare(_app(), terminal_size=(80, 24), run_before=_before("1"))


def test_disconnected_banner(snap_compare):
    client = FakeAdminClient()
    client.is_down = True

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: pilot.app.connection.num_failures >= 1, what="a failed poll")

    assert snap_compare(_app(client), terminal_size=(100, 30), run_before=run_before)


def test_tuning_rejected_edit(snap_compare):
    async def run_before(pilot) -> None:
        app = pilot.app
        await pilot.press("5")
        table = app.screen.query_one("#tunables", DataTable)
        await wait_until(pilot, lambda: table.row_count > 0, what="tunables")
        table.move_cursor(row=table.get_row_index("engine.max_num_seqs"))
        table.focus()
        await pilot.press("enter")
        app.screen.query_one(Input).value = "100000"
        await pilot.press("enter")
        await pilot.pause(0.1)

    assert snap_compare(_app(), terminal_size=(100, 30), run_before=run_before)
