"""`tokenops serve` / `tokenops models`: flags, the open-server rule, admin key, and a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tokenops.config import ConfigError, GatewaySettings, Settings
from tokenops.gateway.auth import ADMIN_KEY_FILE, hash_key, resolve_admin_key
from tokenops.gateway.server import check_exposure, model_from_arg

HERE = Path(__file__).parent


def test_models_command_lists_models_backends_and_replicas(tmp_path):
    from tokenops.cli import build_app

    cfg = tmp_path / "tokenops.toml"
    cfg.write_text('[[models]]\nname = "big"\nbackend = "openai"\nurls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]\n'
                   'cost_input_per_1m = 1.5\n\n[[models]]\nname = "small"\nbackend = "local"\npath = "/models/small"\n')
    result = CliRunner().invoke(build_app(), ["models", "--config", str(cfg), "--json"])
    assert result.exit_code == 0, result.output
    models = {m["name"]: m for m in json.loads(result.output)["models"]}
    assert [r["url"] for r in models["big"]["replicas"]] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert [r["name"] for r in models["big"]["replicas"]] == ["big#0", "big#1"]
    assert models["big"]["cost_input_per_1m"] == 1.5 and models["small"]["backend"] == "local"
    table = CliRunner().invoke(build_app(), ["models", "--config", str(cfg)])
    assert table.exit_code == 0 and "big" in table.output and "small" in table.output


def test_non_loopback_without_keys_is_refused_unless_allowed():
    check_exposure(Settings(), allow_open=False)  # 127.0.0.1 is fine
    with pytest.raises(ConfigError, match="--allow-open"):
        check_exposure(Settings(gateway=GatewaySettings(host="0.0.0.0")), allow_open=False)
    check_exposure(Settings(gateway=GatewaySettings(host="0.0.0.0")), allow_open=True)
    check_exposure(Settings(gateway=GatewaySettings(host="0.0.0.0", api_keys={"k": "t"})), allow_open=False)


def test_serve_refusal_is_one_line(capsys):
    from tokenops.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--host", "0.0.0.0", "--no-store"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: refusing to serve 0.0.0.0") and "\n" not in err


def test_model_argument_takes_folders_and_urls(tmp_path):
    (tmp_path / "my-llama").mkdir()
    (tmp_path / "my-llama" / "config.json").write_text("{}")
    m = model_from_arg(str(tmp_path / "my-llama"))
    assert (m.name, m.backend, m.path) == ("my-llama", "local", str(tmp_path / "my-llama"))
    m = model_from_arg("remote=http://127.0.0.1:9/v1")
    assert (m.name, m.backend, m.url) == ("remote", "openai", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="not a model folder"):
        model_from_arg(str(tmp_path / "nothing"))


def test_generated_admin_key_goes_to_an_owner_only_file_and_is_reused(tmp_path):
    digest, key = resolve_admin_key(None, None, tmp_path)
    assert key and digest == hash_key(key)
    path = tmp_path / ADMIN_KEY_FILE
    assert path.read_text().strip() == key
    assert path.stat().st_mode & 0o777 == 0o600  # issue 17 #7: not readable by other users
    again, new_key = resolve_admin_key(None, None, tmp_path)
    assert again == digest and new_key is None  # not generated (or announced) again
    assert resolve_admin_key("explicit", None, tmp_path) == (hash_key("explicit"), None)
    assert resolve_admin_key(None, "sha256:" + "a" * 64, tmp_path) == ("a" * 64, None)
    legacy = tmp_path / "old"
    legacy.mkdir()
    (legacy / "admin_key.sha256").write_text("b" * 64 + "\n")  # the hash file older versions wrote
    assert resolve_admin_key(None, None, legacy) == ("b" * 64, None)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_serve(tmp_path: Path, port: int) -> subprocess.Popen:
    cfg = tmp_path / "tokenops.toml"
    cfg.write_text('[[models]]\nname = "fake-model"\nbackend = "fake"\n\n[store]\nflush_interval_s = 0.25\n')
    env = dict(os.environ, TOKENOPS_PLUGINS=str(HERE / "fake_backend_plugin.py"), TOKENOPS_ADMIN_KEY="adm")
    proc = subprocess.Popen([sys.executable, "-m", "tokenops", "serve", "--config", str(cfg), "--port", str(port),
                             "--store", str(tmp_path / "store" / "t.duckdb")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("tokenops serve did not become ready")


@pytest.mark.slow
def test_serve_subprocess_graceful_shutdown_flushes_telemetry(tmp_path):
    from tokenops.store import Store

    port = _free_port()
    proc = _start_serve(tmp_path, port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            for _ in range(5):
                r = c.post("/v1/chat/completions", json={"model": "fake-model",
                                                          "messages": [{"role": "user", "content": "x"}]})
                assert r.status_code == 200
            assert c.get("/admin/stats", headers={"X-Admin-Key": "adm"}).json()["requests"]["total"] == 5
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "tokenops serving fake-model" in out
    with Store.open(tmp_path / "store" / "t.duckdb", read_only=True) as store:
        assert store.execute("select count(*) from requests").fetchone()[0] == 5
        assert store.execute("select count(*) from engine_stats").fetchone()[0] >= 1


@pytest.mark.slow
def test_kill_9_under_load_loses_at_most_about_a_second_of_telemetry(tmp_path):
    from tokenops.store import Store

    port = _free_port()
    proc = _start_serve(tmp_path, port)
    done: list[tuple[float, str]] = []  # (client time of the answer, request id)
    stop = threading.Event()

    def worker() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            while not stop.is_set():
                try:
                    r = c.post("/v1/chat/completions", json={"model": "fake-model",
                                                              "messages": [{"role": "user", "content": "load"}]})
                except httpx.HTTPError:
                    return
                if r.status_code == 200:
                    done.append((time.time(), "req-" + r.json()["id"].split("-", 1)[1]))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(4.0)
    killed_at = time.time()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    stop.set()
    for t in threads:
        t.join(timeout=15)
    assert len(done) > 20, "no load reached the server"
    with Store.open(tmp_path / "store" / "t.duckdb") as store:  # reopens cleanly (read-write: WAL replay)
        stored = {row[0] for row in store.execute("select id from requests").fetchall()}
    answered_early = [rid for t, rid in done if t < killed_at - 1.0]
    missing = [rid for rid in answered_early if rid not in stored]
    lost = [t for t, rid in done if rid not in stored]
    print(f"kill -9: {len(done)} answered, {len(stored)} rows stored, {len(lost)} missing, all answered within "
          f"{killed_at - min(lost):.2f} s of the kill" if lost else f"kill -9: {len(done)} answered, none missing")
    assert not missing, f"{len(missing)} of {len(answered_early)} requests answered >1 s before the kill are missing"
    assert len(stored) >= len(answered_early)
