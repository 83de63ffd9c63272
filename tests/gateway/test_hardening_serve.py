"""Issue 17 against a real ``tokenops serve``: connections after errors, browsers on
loopback, slow and greedy clients, secrets at rest, config checked at start, and a
huge prompt that must not stall ``/health``."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tokenops.testing_serve import ServeProcess, free_port

HERE = Path(__file__).parent
CONFIG = """
[[models]]
name = "m"
backend = "boom"

[gateway]
header_timeout_s = 1.0
body_timeout_s = 1.5
max_connections_per_client = 12
"""
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("hardening")
    with ServeProcess(workdir, config=CONFIG, env={"TOKENOPS_PLUGINS": str(HERE / "hardening_plugin.py")},
                      admin_key="") as srv:  # no key given: the server generates one
        yield srv


def _post(conn: http.client.HTTPConnection, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    conn.request("POST", "/v1/chat/completions", body=body, headers={"content-type": content_type})
    r = conn.getresponse()
    return r.status, json.loads(r.read())


def _recv_all(s: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    out = b""
    while chunk := s.recv(4096):
        out += chunk
    return out


def test_errors_keep_the_connection_usable_and_leak_nothing(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    bad = [b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800x"}]}',
           json.dumps({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}).encode(),
           b'{"model": "m", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
           json.dumps({**CHAT, "stream": "yes"}).encode()]
    for body in bad:
        status, data = _post(conn, body)
        assert status == 400, data
        assert "Error" not in data["error"]["message"].split(":")[0]  # no exception class names
    status, data = _post(conn, json.dumps({**CHAT, "messages": [{"role": "user", "content": "boom"}]}).encode())
    assert status == 500 and "internal detail" not in data["error"]["message"] and "error id" in data["error"]["message"]
    status, data = _post(conn, json.dumps(CHAT).encode())  # the same keep-alive connection, still served
    assert status == 200 and data["choices"][0]["message"]["content"]
    conn.close()
    assert "internal detail" in server.log()  # the traceback went to the log, under the error id


def test_openai_client_works_and_a_browser_form_post_does_not(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    assert client.chat.completions.create(model="m", messages=CHAT["messages"]).choices[0].message.content
    r = httpx.post(f"{server.url}/v1/chat/completions", content=json.dumps(CHAT), headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers={"host": "attacker.example"})
    assert r.status_code == 421 and r.json()["error"]["code"] == "host_not_allowed"


def test_slow_headers_are_cut_off(server):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHo")
        s.settimeout(5)
        t0 = time.monotonic()
        answer = _recv_all(s)  # then closed
        assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer
        assert 0.8 < time.monotonic() - t0 < 4


def test_idle_connections_that_never_send_are_closed(server):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 408")


def test_connections_per_client_address_are_bounded(server):
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(12)]
    try:
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", server.port)) as extra:
            extra.settimeout(5)
            assert extra.recv(4096).startswith(b"HTTP/1.1 429")
    finally:
        for s in socks:
            s.close()
    time.sleep(0.3)
    assert httpx.get(f"{server.url}/health").status_code == 200  # slots come back


def test_body_shorter_than_its_content_length(server):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(5)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                  b"content-length: 500\r\n\r\n{\"model\": \"m\"")
        s.shutdown(socket.SHUT_WR)  # the client has nothing more to send
        answer = _recv_all(s)
        assert answer.startswith(b"HTTP/1.1 400") and b"incomplete_body" in answer
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # the body just stops arriving
        s.settimeout(5)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                  b"content-length: 500\r\n\r\n{\"model\": \"m\"")
        answer = _recv_all(s)
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer


def test_generated_admin_key_is_in_a_private_file_not_in_the_output(server):
    key_file = server.store_path.parent / "admin_key"
    key = key_file.read_text().strip()
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert server.store_path.stat().st_mode & 0o777 == 0o600
    log = server.log()
    assert key not in log and str(key_file) in log
    r = httpx.get(f"{server.url}/admin/stats", headers={"X-Admin-Key": key})
    assert r.status_code == 200 and "breakers" in r.json()


def test_serve_admin_key_flags(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file\n")
    with ServeProcess(tmp_path, config=CONFIG, store=False, env={"TOKENOPS_PLUGINS": str(HERE / "hardening_plugin.py")},
                      admin_key="", args=["--admin-key-file", str(key_file)]) as srv:
        assert httpx.get(f"{srv.url}/admin/stats", headers={"X-Admin-Key": "from-a-file"}).status_code == 200
    cmd = [sys.executable, "-m", "tokenops", "serve", "--admin-key-file", str(tmp_path / "missing"), "--no-store"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "admin key file" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


def test_impossible_engine_combination_fails_at_start_with_one_line(tmp_path):
    """Defect 8: a global [plugins.kv_policy] window with a draft-model speculation model."""
    cfg = tmp_path / "tokenops.toml"
    cfg.write_text('[plugins.kv_policy]\nwindow_tokens = 64\n\n[plugins.speculative]\nmethod = "draft"\n'
                   'draft_model = "tokenops/demo_models/draft"\n')
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TOKENOPS_ADMIN_KEY="k")
    out = subprocess.run([sys.executable, "-m", "tokenops", "serve", "--config", str(cfg), "--no-store", "--port",
                          str(free_port())], capture_output=True, text=True, timeout=120, cwd=root, env=env)
    text = (out.stderr + out.stdout).strip()
    assert out.returncode != 0, text
    assert "draft proposer" in text and "Traceback" not in text and len(text.splitlines()) == 1, text


@pytest.mark.slow
def test_a_huge_prompt_does_not_stall_health_on_the_demo_engine(tmp_path):
    """Defect 1 on the bundled engine: 3.9 MB prompts are refused fast, /health keeps answering."""
    prompt = ("lorem ipsum dolor sit amet " * 150_000)[:3_900_000]
    with ServeProcess(tmp_path, store=False) as srv:
        model = httpx.get(f"{srv.base_url}/models").json()["data"][0]["id"]
        gaps: list[float] = []
        stop = threading.Event()

        def probe():
            with httpx.Client(base_url=srv.url) as c:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    assert c.get("/health").status_code == 200
                    gaps.append(time.perf_counter() - t0)
                    time.sleep(0.01)

        t = threading.Thread(target=probe)
        t.start()
        try:
            with httpx.Client(base_url=srv.url, timeout=60) as c:
                for _ in range(3):
                    t0 = time.perf_counter()
                    r = c.post("/v1/chat/completions", json={"model": model, "messages": [
                        {"role": "user", "content": prompt}]})
                    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
                    assert time.perf_counter() - t0 < 5.0
        finally:
            stop.set()
            t.join()
        gaps.sort()
        assert gaps and gaps[int(0.99 * (len(gaps) - 1))] < 0.25, gaps[-5:]


def test_admin_key_flag_warns_and_key_file_wins(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import tokenops.gateway.server as server
    from tokenops.cli import build_app

    app = build_app()
    seen = {}
    monkeypatch.setattr(server, "run_server", lambda settings, **kw: seen.update(key=settings.gateway.admin_key))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["serve", "--admin-key", "on-the-command-line", "--no-store"])
    assert result.exit_code == 0 and seen["key"] == "on-the-command-line"
    assert "visible to every user in ps" in result.output
    (tmp_path / "k").write_text("in-a-file\n")
    result = CliRunner().invoke(app, ["serve", "--admin-key-file", str(tmp_path / "k"), "--no-store"])
    assert result.exit_code == 0 and seen["key"] == "in-a-file" and "warning" not in result.output
