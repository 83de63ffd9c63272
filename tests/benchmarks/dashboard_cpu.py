"""CPU cost of ``tokenops dashboard`` refreshing once a second.

Starts a server in its own process, then runs the real ``tokenops dashboard``
command in a pseudo-terminal (so rendering to a terminal is part of the cost) for
``--seconds`` while traffic flows, visiting every screen. The dashboard process's
CPU time (user + system, all threads, from /proc) over wall time is the figure;
the goal is under 10% of one core.

Servers:
  real  the tokenops gateway + admin API + store with the gateway's FakeBackend
        (MoE-like expert load), fed with chat completions at ~4 requests/s;
  fake  the admin-API fake of the dashboard tests: full-size payloads
        (300-point history, two replicas, an 8x16 expert-load matrix);
  bundled  (opt-in) the gateway on the bundled engine with the default demo model,
        fed like ``real`` (the engine's CPU is in the server process, not counted).

Run: .venv/bin/python tests/benchmarks/dashboard_cpu.py [--seconds 30] [--server real fake bundled]
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TUI_TESTS = HERE.parent / "tui"
SCREEN_KEYS = os.environ.get("DASHBOARD_BENCH_KEYS", "123456")


def serve(kind: str, port: int) -> None:
    """Child process: serve until killed."""
    sys.path.insert(0, str(TUI_TESTS))
    import uvicorn

    if kind == "fake":
        from fake_admin import FakeAdminClient
        from fastapi import FastAPI

        fake, app = FakeAdminClient(), FastAPI()
        app.get("/admin/stats")(lambda: fake.stats())
        app.get("/admin/tunables")(lambda: {"tunables": fake.tunables()})
        app.get("/admin/query/{name}")(lambda name: fake.query(name))
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")
        return
    import httpx
    from real_server import ADMIN_KEY  # noqa: F401 - the parent uses the same key
    from tokenops.config import EngineSettings, GatewaySettings, Settings, StoreSettings
    from tokenops.gateway.app import create_app
    from tokenops.gateway.auth import hash_key
    from tokenops.store import Store, sink
    from tokenops.testing_gateway import FakeBackend

    store_dir = Path(tempfile.mkdtemp(prefix="dashboard-bench-"))
    store = Store.open(store_dir / "t.duckdb")
    sink.attach(store.writer(flush_interval_s=0.5))
    settings = Settings(gateway=GatewaySettings(admin_key=ADMIN_KEY), store=StoreSettings(path=str(store_dir / "t.duckdb")), slo=["ttft_p95=200ms", "e2e_p95=2s"],
                        engine=EngineSettings(kv_cache_tokens=2048, max_num_seqs=8, torch_threads=1))
    if kind == "bundled":
        backends, models = None, None
    else:
        backends = [FakeBackend(model="fake-moe", expert_load=True, delay_s=0.01, name="fake-moe#0"), FakeBackend(model="fake-dense", delay_s=0.005, name="fake-dense#0")]
        models = ["fake-moe", "fake-moe", "fake-dense"]
    app = create_app(settings, backends, store=store, admin_key_hash=hash_key(ADMIN_KEY))

    def traffic() -> None:
        nonlocal models
        i = 0
        while True:
            time.sleep(0.25)
            i += 1
            if models is None:
                try:
                    models = [httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"][0]["id"]]
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    continue
            model = models[i % len(models)]
            body = {"model": model, "messages": [{"role": "user", "content": f"question {i} " * (i % 7 + 1)}], "max_tokens": 16}
            try:
                httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30)
            except httpx.HTTPError:
                pass

    threading.Thread(target=traffic, daemon=True).start()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/admin/tunables", headers={"Authorization": "Bearer dashboard-test-admin-key"}, timeout=2).status_code == 200:
                if httpx.get(url + "/ready", timeout=2).status_code in (200, 404):  # the fake has no /ready
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"server at {url} did not start")


def measure(kind: str, seconds: float, warmup_s: float = 10.0, cols: int = 100, rows: int = 30) -> dict[str, float]:
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url)
        pid, fd = pty.fork()
        if pid == 0:
            os.environ.update(TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
            profile = ["-m", "cProfile", "-o", os.environ["DASHBOARD_BENCH_PROFILE"]] if os.environ.get("DASHBOARD_BENCH_PROFILE") else []
            os.execv(sys.executable, [sys.executable, *profile, "-m", "tokenops", "dashboard", "--url", url, "--admin-key", "dashboard-test-admin-key", "--interval", "1"])
        import fcntl
        import struct
        import termios

        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        num_bytes = 0
        started = time.monotonic()
        cpu0 = wall0 = None
        next_key, key_index = started + warmup_s, 0
        while time.monotonic() - started < warmup_s + seconds:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    num_bytes += len(os.read(fd, 65536))
                except OSError:
                    break
            now = time.monotonic()
            if cpu0 is None and now - started >= warmup_s:
                cpu0, wall0 = _cpu_seconds(pid), now
            if now >= next_key:  # visit every screen, then stay on each a while
                os.write(fd, SCREEN_KEYS[key_index % len(SCREEN_KEYS)].encode())
                key_index += 1
                next_key = now + seconds / len(SCREEN_KEYS)
        cpu1, wall1 = _cpu_seconds(pid), time.monotonic()
        total_cpu = cpu1
        os.write(fd, b"q")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            with __import__("contextlib").suppress(OSError):
                select.select([fd], [], [], 0.1) and os.read(fd, 65536)
        else:
            os.kill(pid, signal.SIGTERM)
        assert cpu0 is not None and wall0 is not None
        return {
            "steady_cpu_s": cpu1 - cpu0,
            "steady_wall_s": wall1 - wall0,
            "steady_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0),
            "total_cpu_s": total_cpu,
            "total_wall_s": wall1 - started,
            "terminal_kib": num_bytes / 1024,
        }
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds (after a 10 s warm-up)")
    parser.add_argument("--server", nargs="+", default=["real", "fake"], choices=["real", "fake", "bundled"])
    parser.add_argument("--serve", choices=["real", "fake", "bundled"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    print(f"tokenops dashboard, 1 s refresh, 100x30 pty, every screen visited; {args.seconds:.0f} s measured after a 10 s warm-up (start-up)")
    print(f"{'server':<8}{'CPU s':>8}{'wall s':>8}{'CPU %':>8}   {'incl. start-up':>16}{'tty KiB':>9}   goal < 10%")
    worst = 0.0
    for kind in args.server:
        r = measure(kind, args.seconds)
        worst = max(worst, r["steady_pct"])
        print(f"{kind:<8}{r['steady_cpu_s']:>8.2f}{r['steady_wall_s']:>8.1f}{r['steady_pct']:>7.1f}%   "
              f"{r['total_cpu_s']:>6.2f} s / {r['total_wall_s']:>4.0f} s{r['terminal_kib']:>9.0f}   {'ok' if r['steady_pct'] < 10 else 'OVER'}")
    print(f"worst steady CPU: {worst:.1f}% of one core")


if __name__ == "__main__":
    main()
