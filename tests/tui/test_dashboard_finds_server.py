"""`tokenops dashboard` with no flags, in the folder of a running `tokenops serve`, connects
to it and shows its data: the URL from the store socket, the key from the server's key
file (as `make serve` then `tokenops dashboard` in a second terminal). Driven in tmux where
tmux can start a server, and through the CLI command with Textual's Pilot everywhere."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import openai
import pytest

from tokenops.testing_serve import ServeProcess

def _tmux_works() -> bool:
    """tmux is installed and can start a server (it cannot where /dev/null is not a device)."""
    if shutil.which("tmux") is None:
        return False
    name = f"probe-{uuid.uuid4().hex[:8]}"
    ok = subprocess.run(["tmux", "-L", name, "new-session", "-d", "sleep 1"], capture_output=True).returncode == 0
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)
    return ok


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


@pytest.mark.skipif(not _tmux_works(), reason="tmux cannot start a server here")
def test_dashboard_with_no_flags_connects_to_this_folders_server(tmp_path):
    # no TOKENOPS_ADMIN_KEY: the server writes store/admin_key, as a plain `tokenops serve` does
    with ServeProcess(tmp_path, admin_key="") as srv:
        assert (tmp_path / "store" / "admin_key").is_file()
        _traffic(srv)
        session = f"tokenops-dash-{uuid.uuid4().hex[:8]}"
        command = (f"cd {shlex.quote(str(tmp_path))} && env -u TOKENOPS_ADMIN_KEY -u TOKENOPS_URL -u TOKENOPS_STORE "
                   f"{shlex.quote(sys.executable)} -m tokenops dashboard")
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", command], check=True,
                       env={k: v for k, v in os.environ.items() if k != "TMUX"})
        try:
            deadline, screen = time.monotonic() + 120, ""
            while time.monotonic() < deadline:
                screen = _pane(session)
                if "tokenops-demo" in screen and srv.url.removeprefix("http://") in screen:
                    break
                subprocess.run(["tmux", "send-keys", "-t", session, "3"], capture_output=True)  # Models screen
                time.sleep(1)
            assert "tokenops-demo" in screen, screen
            assert srv.url.removeprefix("http://") in screen, screen  # the server of this folder, not :8000
            assert "unreachable" not in screen.lower() and "admin key" not in screen.lower(), screen
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
