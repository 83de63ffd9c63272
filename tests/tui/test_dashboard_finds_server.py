"""`tokenops dashboard` with no flags, in the folder of a running `tokenops serve`, connects
to it and shows its data: the URL from the store socket, the key from the server's key
file (as `make serve` then `tokenops dashboard` in a second terminal). Driven in a tmux pane
(tmux_pane.py: a foreground tmux server, so it runs where /dev/null is not a device), and
through the CLI command with Textual's Pilot."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import openai
import pytest
from tmux_pane import TmuxPane, clean_env, tmux_available

from tokenops.testing_serve import ServeProcess


def _traffic(srv: ServeProcess, n: int = 3) -> None:
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
    for _ in range(n):
        client.chat.completions.create(model="tokenops-demo", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4)


async def test_the_command_with_no_flags_opens_this_folders_server(tmp_path, monkeypatch):
    from pilot_wait import wait_until
    from typer.testing import CliRunner

    from tokenops.cli import build_app
    from tokenops.tui.app import DashboardApp
    from tokenops.tui.client import AdminClient

    with ServeProcess(tmp_path, admin_key="") as srv:  # no key given: serve writes store/admin_key
        _traffic(srv)
        seen: dict[str, str] = {}

        def run(self: DashboardApp) -> None:  # what the command would show: its client's URL and key
            seen.update(url=self.client.url, auth=self.client._http.headers.get("authorization", ""))

        monkeypatch.setattr(DashboardApp, "run", run)
        monkeypatch.chdir(tmp_path)
        for name in ("TOKENOPS_ADMIN_KEY", "TOKENOPS_URL", "TOKENOPS_STORE", "TOKENOPS_CONFIG"):
            monkeypatch.delenv(name, raising=False)
        result = CliRunner().invoke(build_app(), ["dashboard"])
        assert result.exit_code == 0, result.output
        key = (tmp_path / "store" / "admin_key").read_text().strip()
        assert seen == {"url": srv.url, "auth": f"Bearer {key}"}  # this folder's server and key, not :8000
        client = AdminClient(seen["url"], key)
        app = DashboardApp(client, poll_interval_s=0.3, max_backoff_s=1.0)
        try:
            async with app.run_test(size=(140, 36)) as pilot:
                await wait_until(pilot, lambda: app.last_stats is not None
                                 and app.last_stats["requests"]["total"] >= 3, timeout_s=60, what="the server's stats")
                await pilot.press("3")  # Models & routing: the served model's row
                await wait_until(pilot, lambda: "tokenops-demo" in app.screen_text(), timeout_s=30, what="models")
        finally:
            client.close()


class MakeServe(ServeProcess):
    """``make serve ARGS="--port N"`` in ``workdir``: the venv's ``tokenops serve --port N``, no other flag,
    so the server opens the folder's default store (``store/tokenops.duckdb``) as a user's would."""

    def command(self) -> list[str]:
        return [str(Path(sys.executable).with_name("tokenops")), "serve", "--port", str(self.port)]


def _model_row_requests(screen: str, model: str) -> int | None:
    """The ``requests`` cell of ``model``'s row in the Models & routing table, as the pane shows it."""
    for line in screen.splitlines():
        words = line.replace("│", " ").split()  # model  bar share%  requests  errors  in tokens ...
        if words and words[0] == model:
            numbers = [w for w in words[1:] if re.fullmatch(r"[\d,]+", w)]
            if numbers:
                return int(numbers[0].replace(",", ""))
    return None


@pytest.mark.skipif(not tmux_available(), reason="tmux is not installed")
def test_dashboard_with_no_flags_connects_to_this_folders_server(tmp_path):
    """As a user: `make serve ARGS="--port N"` in one terminal, `tokenops dashboard` in a second one in
    the same folder; the pane shows this server (not :8000) and its request count moving with traffic."""
    # no TOKENOPS_ADMIN_KEY: the server writes store/admin_key, as a plain `tokenops serve` does
    with MakeServe(tmp_path, admin_key="") as srv:
        assert (tmp_path / "store" / "tokenops.duckdb").is_file() and (tmp_path / "store" / "admin_key").is_file()
        _traffic(srv, 2)
        env = clean_env(drop=("TOKENOPS_ADMIN_KEY", "TOKENOPS_URL", "TOKENOPS_STORE", "TOKENOPS_CONFIG"))
        dashboard = f"{shlex.quote(str(Path(sys.executable).with_name('tokenops')))} dashboard"
        with TmuxPane(dashboard, cwd=str(tmp_path), env=env) as pane:
            host = srv.url.removeprefix("http://")
            screen = pane.wait_for(lambda s: _model_row_requests(s, "tokenops-demo") == 2 and host in s,
                                   timeout_s=120, what="tokenops-demo with 2 requests from " + host,
                                   every=lambda: pane.keys("3"))  # 3: Models & routing
            assert "unreachable" not in screen.lower() and "admin key" not in screen.lower(), screen
            _traffic(srv, 3)  # live: the same pane catches up with new traffic
            pane.wait_for(lambda s: _model_row_requests(s, "tokenops-demo") == 5, timeout_s=60,
                          what="tokenops-demo with 5 requests")
