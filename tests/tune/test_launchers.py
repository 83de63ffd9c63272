"""Launcher plugins: tunables -> vLLM/SGLang flags, the registry, and `tokenops tune --launch
--engine vllm` end to end against a fake ``vllm`` executable that records how it was started."""

import json
import os
import stat
import sys
import tomllib
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tokenops import hookimpl
from tokenops import plugin_manager as plugins
from tokenops.cli import build_app, main
from tokenops.tune.launcher import LaunchOptions, ServerProcess, TokenopsLauncher, env_for
from tokenops.tune.target import TuneError

# A stand-in for `vllm serve`: strict argparse over the flags the launcher may pass (an unknown
# flag exits 2, as vLLM would), one JSON line per start in $FAKE_VLLM_RECORD, and a streaming
# OpenAI-compatible server whose per-token delay shrinks as --max-num-seqs grows.
FAKE_VLLM = r'''#!PYTHON
import argparse, json, os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser(prog="vllm")
p.add_argument("command", choices=["serve"])
p.add_argument("model")
p.add_argument("--host", required=True)
p.add_argument("--port", type=int, required=True)
p.add_argument("--max-num-seqs", type=int, default=256)
p.add_argument("--max-num-batched-tokens", type=int, default=8192)
p.add_argument("--block-size", type=int, choices=[8, 16, 32], default=16)
p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
p.add_argument("--max-model-len", type=int)
p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
p.add_argument("--seed", type=int)
args = p.parse_args()
with open(os.environ["FAKE_VLLM_RECORD"], "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:]}) + "\n")
TOKEN_S = 0.2 / args.max_num_seqs
started = time.monotonic()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def _json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":  # not healthy at once: the launcher must wait
            self._json(200 if time.monotonic() - started > 0.3 else 503, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": args.model, "object": "model"}]})
        else:
            self._json(404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            return self._json(404, {})
        n = int(body.get("max_tokens") or 16)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            time.sleep(TOKEN_S)
            choice = {"index": 0, "delta": {"content": f" w{i}"}} if chat else {"index": 0, "text": f" w{i}"}
            self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            self.wfile.flush()
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


server = ThreadingHTTPServer((args.host, args.port), Handler)
server.daemon_threads = True
server.serve_forever()
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A `vllm` executable first on PATH; returns the file its starts are recorded in."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "vllm"
    exe.write_text(FAKE_VLLM.replace("PYTHON", sys.executable, 1))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "starts.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    monkeypatch.delenv("TOKENOPS_VLLM_BIN", raising=False)
    return record


def _launcher(name, **options):
    return plugins.get_launchers()[name](LaunchOptions(**options))


SERVER = SimpleNamespace(port=1234)


def test_vllm_flags(monkeypatch):
    monkeypatch.setenv("TOKENOPS_VLLM_BIN", sys.executable)  # any executable: only the argv is built
    vllm = _launcher("vllm", model="org/model", extra_args=["--seed", "1"])
    argv = vllm.command({"vllm.max_num_seqs": 64, "vllm.enable_prefix_caching": True,
                         "vllm.enable_chunked_prefill": False, "vllm.gpu_memory_utilization": 0.85,
                         "vllm.block_size": 32, "vllm.max_model_len": 0, "vllm.max_num_batched_tokens": 2048},
                        SERVER)
    assert argv == [sys.executable, "serve", "org/model", "--host", "127.0.0.1", "--port", "1234",
                    "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--block-size", "32",
                    "--enable-prefix-caching", "--no-enable-chunked-prefill", "--gpu-memory-utilization", "0.85",
                    "--seed", "1"]
    # 0 leaves the length to the model; a real length is passed; a tunable left out of the search is not
    assert vllm.flag_args({"vllm.max_model_len": 4096, "vllm.enable_prefix_caching": False}) == [
        "--no-enable-prefix-caching", "--max-model-len", "4096"]
    assert vllm.flag_args({}) == []
    with pytest.raises(TuneError, match="no command-line flag for engine.max_num_seqs"):
        vllm.flag_args({"engine.max_num_seqs": 4})


def test_vllm_takes_a_local_model_folder_as_an_absolute_path(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENOPS_VLLM_BIN", sys.executable)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    assert _launcher("vllm", model="m").command({}, SERVER)[2] == str(tmp_path / "m")


def test_sglang_flags(monkeypatch):
    monkeypatch.setenv("TOKENOPS_SGLANG_PYTHON", sys.executable)
    sglang = _launcher("sglang", model="org/model")
    argv = sglang.command({"sglang.max_running_requests": 128, "sglang.chunked_prefill_size": 4096,
                           "sglang.max_prefill_tokens": 16384, "sglang.mem_fraction_static": 0.8,
                           "sglang.schedule_policy": "lpm", "sglang.schedule_conservativeness": 0.6,
                           "sglang.disable_radix_cache": True}, SERVER)
    assert argv == [sys.executable, "-m", "sglang.launch_server", "--model-path", "org/model", "--host", "127.0.0.1",
                    "--port", "1234", "--max-running-requests", "128", "--chunked-prefill-size", "4096",
                    "--max-prefill-tokens", "16384", "--schedule-policy", "lpm", "--schedule-conservativeness", "0.6",
                    "--disable-radix-cache", "--mem-fraction-static", "0.8"]
    # the radix cache is on unless told otherwise: false passes nothing
    assert sglang.flag_args({"sglang.disable_radix_cache": False, "sglang.schedule_conservativeness": 1.0}) == [
        "--schedule-conservativeness", "1.0"]


def test_launcher_command_replaces_the_program(monkeypatch):
    monkeypatch.delenv("TOKENOPS_SGLANG_PYTHON", raising=False)
    sglang = _launcher("sglang", model="m", command=f"{sys.executable} -m sglang.launch_server --trust-remote-code")
    assert sglang.command({}, SERVER)[:4] == [sys.executable, "-m", "sglang.launch_server", "--trust-remote-code"]


def test_registry_holds_the_launchers_and_their_restart_tunables():
    registry = plugins.get_tunables()
    launchers = plugins.get_launchers()
    assert {"tokenops", "vllm", "sglang"} <= set(launchers)
    for name, prefix, expected in (
        ("vllm", "vllm.", {"max_num_seqs", "max_num_batched_tokens", "block_size", "gpu_memory_utilization",
                           "enable_prefix_caching", "enable_chunked_prefill", "max_model_len"}),
        ("sglang", "sglang.", {"max_running_requests", "chunked_prefill_size", "max_prefill_tokens",
                               "mem_fraction_static", "schedule_policy", "schedule_conservativeness",
                               "disable_radix_cache"})):
        assert launchers[name].prefixes == (prefix,)
        owned = [t for t in registry if t.name.startswith(prefix)]
        assert {t.name.removeprefix(prefix) for t in owned} == expected
        assert all(t.plugin == "launchers" and not t.live for t in owned)
    assert registry["vllm.block_size"].choices == (8, 16, 32)
    assert registry["sglang.schedule_policy"].choices == ("fcfs", "lpm", "random", "dfs-weight")
    assert registry["vllm.max_num_seqs"].log and registry["vllm.gpu_memory_utilization"].type == "float"
    info = {p.name: p for p in plugins.list_plugins()}["launchers"]
    assert info.layer == "compute_model" and info.launchers == ["sglang", "tokenops", "vllm"]


def test_a_launcher_name_registered_twice_is_one_line_error():
    class Twice:
        @hookimpl
        def tokenops_register_launchers(self, register):
            register("vllm", TokenopsLauncher)

    name = plugins.register_plugin(Twice(), "twice")
    try:
        with pytest.raises(plugins.PluginLoadError) as exc:
            plugins.get_launchers()
        assert str(exc.value) == "launcher 'vllm' is registered twice (launchers and twice)"
    finally:
        plugins.unregister_plugin(name)


def test_the_bundled_engine_launcher_keeps_its_environment():
    server = TokenopsLauncher().prepare({"engine.block_size": 32, "engine.enable_prefix_caching": False})
    assert server.proc is None  # prepared, not started
    assert server.ready_paths == ("/ready",) and server.admin_key and "serve" in server.argv
    env = server.env
    assert env["TOKENOPS_ENGINE__BLOCK_SIZE"] == "32" and env["TOKENOPS_ENGINE__ENABLE_PREFIX_CACHING"] == "false"
    assert env["TOKENOPS_GATEWAY__PORT"] == str(server.port) and env["TOKENOPS_ADMIN_KEY"] == server.admin_key
    assert env_for({"gateway.max_body_bytes": 5}) == {"TOKENOPS_GATEWAY__MAX_BODY_BYTES": "5"}
    launcher = TokenopsLauncher()
    assert launcher.owns("engine.block_size") and not launcher.owns("vllm.block_size") and launcher.has_admin_api


def test_missing_vllm_is_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no vllm anywhere
    monkeypatch.delenv("TOKENOPS_VLLM_BIN", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["tune", "--launch", "--engine", "vllm", "--model", "m", "--slo", "p95=1s", "--no-store"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no 'vllm' executable on PATH" in err[0] and "TOKENOPS_VLLM_BIN" in err[0]


def test_unknown_engine_lists_the_launchers(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--launch", "--engine", "trt", "--slo", "p95=1s", "--no-store"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown --engine 'trt'" in err[0] and "sglang, tokenops, vllm" in err[0]


def test_a_server_that_exits_at_start_is_one_line_error_with_its_log(fake_vllm):
    vllm = _launcher("vllm", model="m", extra_args=["--no-such-flag"], ready_timeout_s=30)
    with pytest.raises(TuneError) as exc:
        vllm.launch({})
    msg = str(exc.value)
    assert "\n" not in msg and "vllm exited with code 2" in msg and "unrecognized arguments: --no-such-flag" in msg


def _is_gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie nobody has reaped yet has ended too
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_server_never_ready_times_out_and_its_whole_group_is_stopped(tmp_path):
    pids = tmp_path / "pids"
    server = ServerProcess("slow", {}, ready_timeout_s=3)
    server.argv = [sys.executable, "-c", "import subprocess, sys, os, time; "
                   "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                   "open(sys.argv[1], 'w').write(f'{os.getpid()} {w.pid}'); print('loading', flush=True); "
                   "time.sleep(60)", str(pids)]
    with pytest.raises(TuneError) as exc:
        server.start()
    msg = str(exc.value)
    assert "\n" not in msg and "slow was not ready after 3s (waiting for /health and /v1/models)" in msg
    assert "loading" in msg and str(server.log_path) in msg
    assert server.proc is None
    parent, worker = map(int, pids.read_text().split())
    assert _is_gone(parent) and _is_gone(worker)


def test_tune_relaunches_vllm_per_configuration(fake_vllm, tmp_path):
    r = CliRunner().invoke(build_app(), [
        "tune", "--launch", "--engine", "vllm", "--model", "fake", "--slo", "e2e_p95=150ms", "--budget", "3",
        "--only", "vllm.max_num_seqs", "--only", "vllm.enable_prefix_caching", "--param", "vllm.max_num_seqs=8,64",
        "--input-len", "8", "--output-len", "8", "--measure-seconds", "0.5", "--min-requests", "8",
        "--max-measurements", "2", "--start-rate", "10", "--no-store", "--profile-dir", str(tmp_path / "profiles"),
        "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["model"] == "fake"
    assert out["space"] == {"vllm.enable_prefix_caching": [True, False], "vllm.max_num_seqs": [8, 64, 256]}
    trials = out["trials"]
    assert len(trials) == 3
    assert trials[0]["params"] == {"vllm.enable_prefix_caching": True, "vllm.max_num_seqs": 256}

    starts = [json.loads(line) for line in fake_vllm.read_text().splitlines()]
    assert len(starts) == 3  # the default once (probe and trial 0 share it), then one start per other configuration
    for start, trial in zip(starts, trials):
        argv = start["argv"]
        assert argv[:2] == ["serve", "fake"]
        assert argv[argv.index("--max-num-seqs") + 1] == str(trial["params"]["vllm.max_num_seqs"])
        caching = trial["params"]["vllm.enable_prefix_caching"]
        assert ("--enable-prefix-caching" if caching else "--no-enable-prefix-caching") in argv
    assert len({tuple(s["argv"][4:]) for s in starts}) == 3  # three flag sets (ports differ too)
    for start in starts:  # every server was stopped
        with pytest.raises(ProcessLookupError):
            os.kill(start["pid"], 0)

    # 8 slots make a token take 25 ms here: 8 tokens miss a 150 ms E2E p95; the winner has more slots
    assert out["best"] is not None and out["best"]["params"]["vllm.max_num_seqs"] in (64, 256)
    for t in trials:
        if t["params"]["vllm.max_num_seqs"] == 8:
            assert t["goodput"] < out["best"]["goodput"]
    prof = tomllib.loads(open(out["profile"]).read())
    assert prof["tune"]["engine"] == "vllm" and prof["tunables"] == out["best"]["params"]
    best = out["best"]["params"]
    assert out["launch_flags"] == prof["tune"]["launch_flags"] == [
        "--max-num-seqs", str(best["vllm.max_num_seqs"]),
        "--enable-prefix-caching" if best["vllm.enable_prefix_caching"] else "--no-enable-prefix-caching"]
    assert os.path.basename(out["profile"]).startswith("vllm-fake-")
