"""``tokenops dashboard``: where URL and key come from, one-line errors, lazy textual import."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from tokenops.cli import build_app
from tokenops.cli.dashboard import resolve_connection


def test_resolve_from_config_flags_and_env(tmp_path, monkeypatch):
    config = tmp_path / "tokenops.toml"
    config.write_text('[gateway]\nhost = "0.0.0.0"\nport = 9123\nadmin_key = "from-config"\n')
    monkeypatch.delenv("TOKENOPS_ADMIN_KEY", raising=False)
    assert resolve_connection(None, None, str(config)) == ("http://127.0.0.1:9123", "from-config")
    assert resolve_connection("http://h:1/", "flag-key", str(config)) == ("http://h:1", "flag-key")
    monkeypatch.setenv("TOKENOPS_ADMIN_KEY", "env-key")  # the config loader's own override
    assert resolve_connection(None, None, str(config))[1] == "env-key"


def test_command_wires_flags_and_environment_into_the_app(tmp_path, monkeypatch):
    from tokenops.tui.app import DashboardApp

    seen = {}

    def fake_run(self):
        seen.update(url=self.client.url, interval=self.poll_interval_s, auth=self.client._http.headers.get("authorization"))

    monkeypatch.setattr(DashboardApp, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(build_app(), ["dashboard", "--interval", "2"], env={"TOKENOPS_URL": "http://10.0.0.5:8000", "TOKENOPS_ADMIN_KEY": "k1"})
    assert result.exit_code == 0, result.output
    assert seen == {"url": "http://10.0.0.5:8000", "interval": 2.0, "auth": "Bearer k1"}


def test_bad_url_is_one_line():
    out = subprocess.run([sys.executable, "-m", "tokenops", "dashboard", "--url", "localhost:8000"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: --url must start with http:// or https://, got 'localhost:8000'"]


def test_cli_does_not_import_textual_until_the_dashboard_runs():
    code = "import sys, tokenops.cli as c; c.build_app(); print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
