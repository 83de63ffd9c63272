"""`tokenops dashboard` builds every screen at start-up (prewarm_screens), so a screen's
first visit does not cost a full CSS pass mid-session (tests/benchmarks/dashboard_cpu.py)."""

from __future__ import annotations

from pilot_wait import wait_until

from tokenops.tui.app import DashboardApp
from tokenops.tui.screens.base import DashboardScreen


async def test_prewarm_builds_every_screen_and_returns_to_the_overview(fake_client):
    app = DashboardApp(fake_client, poll_interval_s=0.05, max_backoff_s=0.4, prewarm_screens=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.current_mode == app.DEFAULT_MODE and all(
            app._screen_stacks.get(mode) for mode in app.MODES), what="every mode built")
        await wait_until(pilot, lambda: app.last_stats is not None, what="first stats")
        assert isinstance(app.screen, DashboardScreen)
        await pilot.press("4")  # a prewarmed screen shows the latest snapshot at once
        await wait_until(pilot, lambda: app.current_mode == "experts", what="experts screen")


async def test_tests_and_embedders_get_no_prewarm_by_default(fake_client):
    app = DashboardApp(fake_client, poll_interval_s=0.05, max_backoff_s=0.4)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.last_stats is not None, what="first stats")
        assert set(app._screen_stacks) == {app.DEFAULT_MODE}
