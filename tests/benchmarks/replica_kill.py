#!/usr/bin/env python
"""kill -9 one of two replicas under load: what do clients see? (issue 17, defect 4)

    .venv/bin/python tests/benchmarks/replica_kill.py
    .venv/bin/python tests/benchmarks/replica_kill.py --clients 6 --seconds 10 --no-breaker

Real processes throughout: two upstream ``tokenops serve`` processes (a fake engine
answering 40 words at 25 ms per word, ``replica_kill_plugin.py``) behind a third
``tokenops serve`` whose model ``m`` has both as replicas (``backend = "openai"``,
``urls = [...]``), with ``[plugins.circuit_breaker]`` (health probes every 0.5 s);
``--default-breaker`` leaves that section out (the breaker a model with two replicas
gets by default), ``--no-breaker`` turns breakers off (retries only). Clients use the openai SDK (``max_retries=0``), closed loop.

Scenarios (fresh processes each):

- ``between requests``: non-streamed requests of 4 tokens (~0.1 s); upstream A is
  killed (SIGKILL) ``--kill-at`` seconds in. Goal: 0 client-visible errors.
- ``mid-stream``: streamed requests of 40 tokens (~1 s); A is killed while streams
  are in flight. The streams A was serving break (their bytes were already sent;
  nothing can retry them); goal: errors stop within 2 s of the kill.

Printed per scenario: requests, client-visible errors, seconds from the kill to the
last error, requests answered after the kill, and the breaker state of A in
``/admin/stats`` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
PLUGIN = Path(__file__).with_name("replica_kill_plugin.py")


def upstream(workdir: Path):
    from tokenops.testing_serve import ServeProcess

    return ServeProcess(workdir, config='[[models]]\nname = "m"\nbackend = "bench_fake"\n', store=False,
                        env={"TOKENOPS_PLUGINS": str(PLUGIN)})


def gateway(workdir: Path, urls: list[str], breaker: str):
    """``breaker``: "configured" (a [plugins.circuit_breaker] section), "default" (none) or "off"."""
    from tokenops.testing_serve import ServeProcess

    config = f'[[models]]\nname = "m"\nbackend = "openai"\nurls = {json.dumps(urls)}\n'
    if breaker == "configured":
        config += ("\n[plugins.circuit_breaker]\nconsecutive_failures = 3\ncooldown_s = 2.0\n"
                   "health_probe_interval_s = 0.5\n")
    elif breaker == "off":
        config += "\n[plugins.circuit_breaker]\nenabled = false\n"
    return ServeProcess(workdir, config=config, store=False)


def run(stream: bool, clients: int, seconds: float, kill_at: float, breaker: str) -> dict:
    import openai

    base = Path(tempfile.mkdtemp(prefix="replica-kill-"))
    a, b = upstream(base / "a"), upstream(base / "b")
    gw = gateway(base / "gw", [a.base_url, b.base_url], breaker)
    try:
        a.start()
        b.start()
        gw.start()
        results: list[tuple[float, bool, str]] = []  # (time after start, ok, error)
        t0 = time.monotonic()
        lock = threading.Lock()

        def worker() -> None:
            client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)
            while time.monotonic() - t0 < seconds:
                error = ""
                try:
                    if stream:
                        chunks = client.chat.completions.create(model="m", stream=True, messages=[
                            {"role": "user", "content": "go"}])
                        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                        if not text.strip().endswith("w39"):
                            error = f"truncated answer ({len(text.split())} words)"
                    else:
                        r = client.chat.completions.create(model="m", max_tokens=4, messages=[
                            {"role": "user", "content": "go"}])
                        if not r.choices[0].message.content:
                            error = "empty answer"
                except Exception as e:  # what the client sees: APIError, APIConnectionError...
                    error = f"{type(e).__name__}: {str(e)[:80]}"
                with lock:
                    results.append((time.monotonic() - t0, not error, error))

        threads = [threading.Thread(target=worker) for _ in range(clients)]
        for t in threads:
            t.start()
        time.sleep(kill_at)
        killed_at = time.monotonic() - t0
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait()
        for t in threads:
            t.join()
        import httpx

        stats = httpx.get(f"{gw.url}/admin/stats", headers=gw.admin_headers).json()
        errors = [(t, e) for t, ok, e in results if not ok]
        return {"requests": len(results), "errors": len(errors),
                "error_seconds_after_kill": max((t - killed_at for t, _ in errors), default=0.0),
                "ok_after_kill": sum(1 for t, ok, _ in results if ok and t > killed_at),
                "error_kinds": sorted({e for _, e in errors}),
                "breakers": stats.get("breakers", {})}
    finally:
        gw.stop()
        b.stop()
        a.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--kill-at", type=float, default=3.0)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-breaker", action="store_true", help="retries only: [plugins.circuit_breaker] enabled = false")
    mode.add_argument("--default-breaker", action="store_true",
                      help="no [plugins.circuit_breaker] section: the breaker two replicas get by default")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {}
    for name, stream in (("between requests", False), ("mid-stream", True)):
        r = out[name] = run(stream, args.clients, args.seconds, args.kill_at,
                                  "off" if args.no_breaker else "default" if args.default_breaker else "configured")
        if not args.json:
            print(f"{name:>16}: {r['requests']} requests, {r['errors']} client-visible errors "
                  f"{r['error_kinds'] or ''}, errors until {r['error_seconds_after_kill']:.2f} s after the kill, "
                  f"{r['ok_after_kill']} answered after it; breakers {r['breakers']}", flush=True)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        between, mid = out["between requests"], out["mid-stream"]
        print(f"goal 0 errors for kills between requests: {'OK' if between['errors'] == 0 else 'MISSED'}; "
              f"goal errors stop within 2 s mid-stream: {'OK' if mid['error_seconds_after_kill'] < 2 else 'MISSED'}")


if __name__ == "__main__":
    main()
