#!/usr/bin/env python
"""``/health`` latency while another client sends huge requests in a loop (issue 17, defect 1).

    .venv/bin/python tests/benchmarks/hostile_load.py
    .venv/bin/python tests/benchmarks/hostile_load.py --seconds 20 --prompt-mb 3.9

Starts a real ``tokenops serve`` on the bundled demo model (``tokenops.testing_serve``),
then for each scenario probes ``GET /health`` every 20 ms from one client for
``--seconds`` while a second client loops over one kind of request:

- ``idle``: nothing else (the peer the other rows compare with);
- ``3.9MB prompt``: a chat request with one ~3.9 MB message (under the 4 MB body limit);
- ``9,999 messages``: one-word messages, just under ``[gateway] max_messages``;
- ``100,000 messages``: over the limit, refused before validation.

Prints per scenario: /health p50/p99/max (ms), hostile requests sent and their
status codes and mean latency. Goal: /health p99 under 50 ms in every scenario.
The machine may be shared: compare rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def run_scenario(url: str, body: bytes | None, seconds: float) -> dict:
    import httpx

    health: list[float] = []
    statuses: Counter = Counter()
    latencies: list[float] = []
    stop = threading.Event()

    def hostile() -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                r = c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
                latencies.append(time.perf_counter() - t0)
                statuses[r.status_code] += 1

    worker = threading.Thread(target=hostile, daemon=True) if body is not None else None
    if worker:
        worker.start()
        time.sleep(0.2)
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30) as c:
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            assert c.get("/health").status_code == 200
            health.append(time.perf_counter() - t0)
            time.sleep(0.02)
    stop.set()
    if worker:
        worker.join(timeout=120)
    return {"health_p50_ms": 1000 * _percentile(health, 0.5), "health_p99_ms": 1000 * _percentile(health, 0.99),
            "health_max_ms": 1000 * max(health), "health_probes": len(health),
            "hostile_sent": sum(statuses.values()), "hostile_status": dict(statuses),
            "hostile_mean_s": statistics.fmean(latencies) if latencies else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="probe time per scenario")
    ap.add_argument("--prompt-mb", type=float, default=3.9)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from tokenops.testing_serve import ServeProcess

    with ServeProcess(tempfile.mkdtemp(prefix="hostile-"), store=False) as srv:
        import httpx

        model = httpx.get(f"{srv.base_url}/models").json()["data"][0]["id"]
        size = int(args.prompt_mb * 1_000_000)
        prompt = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
        scenarios = {
            "idle": None,
            f"{args.prompt_mb:g}MB prompt": json.dumps({"model": model, "max_tokens": 4, "messages": [
                {"role": "user", "content": prompt}]}).encode(),
            "9,999 messages": json.dumps({"model": model, "max_tokens": 4, "messages": [
                {"role": "user", "content": "word"}] * 9_999}).encode(),
            "100,000 messages": json.dumps({"model": model, "max_tokens": 4, "messages": [
                {"role": "user", "content": "word"}] * 100_000}).encode(),
        }
        results = {}
        for name, body in scenarios.items():
            results[name] = run_scenario(srv.url, body, args.seconds)
            if not args.json:
                r = results[name]
                mean = f"{r['hostile_mean_s']:.2f} s" if r["hostile_mean_s"] is not None else "-"
                print(f"{name:>18}: /health p50 {r['health_p50_ms']:6.1f} ms  p99 {r['health_p99_ms']:6.1f} ms  "
                      f"max {r['health_max_ms']:6.1f} ms  ({r['health_probes']} probes)  hostile: "
                      f"{r['hostile_sent']} sent {r['hostile_status']} mean {mean}", flush=True)
    worst = max(r["health_p99_ms"] for r in results.values())
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"worst /health p99: {worst:.1f} ms (goal < 50 ms): {'OK' if worst < 50 else 'MISSED'}")


if __name__ == "__main__":
    main()
