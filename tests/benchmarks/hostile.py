"""Hardening III's hostile families (tests/hardening/hostile_cases.py) against a real
``tokenops serve`` on the default model, one case at a time, with ``/health`` probed every 20 ms
from another process and the server's RSS read from ``/proc``. Printed per family: cases, worst
status, 5xx, the worst ``/health`` p99 and max while a case of it ran, and the largest RSS growth
of one case; then the whole run's growth. Goals (issue 51, quiet box): never a 5xx, ``/health`` p99
< 50 ms and max < 250 ms, RSS growth < 256 MiB per case and < 512 MiB in all. The peer row is the
probe alone, with no case running, in the same run.

    .venv/bin/python tests/benchmarks/hostile.py [--rounds 1] [--json]

``--url URL --pid PID`` measures a running server (configured like ``hostile_cases.server_config``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "hardening"))
sys.path.insert(0, str(HERE.parents[2]))
import hostile_cases  # noqa: E402
from health_probe import HealthProbe, rss_bytes  # noqa: E402


def run(url: str, pid: int, rounds: int) -> dict:
    probe = HealthProbe(url, pid)
    try:
        t0 = time.monotonic()
        time.sleep(5)
        idle = probe.window(t0, time.monotonic())
        start = rss_bytes(pid)
        rows: dict[str, list] = defaultdict(list)
        with httpx.Client(base_url=url, timeout=120) as client:
            for _ in range(rounds):
                for case in hostile_cases.cases(url):
                    m = hostile_cases.measure(case, client, probe)
                    rows[case.family].append(m)
                    print(
                        f"  {case.family:15s} {case.name:62s} {str(m.statuses[-3:]):16s} {m.seconds:6.2f} s  "
                        f"p99 {m.health_p99_ms:6.1f} ms  max {m.health_max_ms:6.1f} ms  RSS +{m.rss_growth_mib:.0f} MiB",
                        flush=True,
                    )
        total = (rss_bytes(pid) - start) / 2**20
    finally:
        probe.close()
    table = {
        "idle probe (peer)": {
            "cases": 0,
            "num_5xx": 0,
            "health_p99_ms": idle.p99_ms,
            "health_max_ms": idle.max_ms,
            "rss_growth_mib": 0.0,
        }
    }
    for family, ms in rows.items():
        table[family] = {
            "cases": len(ms),
            "num_5xx": sum(s >= 500 for m in ms for s in m.statuses),
            "failed": [m.case.name for m in ms if m.case.verdict(m.statuses)],
            "health_p99_ms": max(m.health_p99_ms for m in ms),
            "health_max_ms": max(m.health_max_ms for m in ms),
            "rss_growth_mib": max(m.rss_growth_mib for m in ms),
        }
    return {"families": table, "rss_growth_total_mib": total}


def print_table(figures: dict) -> None:
    print("\n| family | cases | 5xx | not as expected | worst /health p99 | worst /health max | worst RSS growth |")
    print("|---|---|---|---|---|---|---|")
    for family, f in figures["families"].items():
        print(
            f"| {family} | {f['cases']} | {f['num_5xx']} | {len(f.get('failed', []))} | {f['health_p99_ms']:.1f} ms "
            f"| {f['health_max_ms']:.1f} ms | {f['rss_growth_mib']:.0f} MiB |"
        )
    print(f"\nRSS growth over the run: {figures['rss_growth_total_mib']:.0f} MiB (goal < 512)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url")
    parser.add_argument("--pid", type=int)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.url:
        if args.pid is None:
            parser.error("--url needs --pid (the server's process, for RSS)")
        figures = run(args.url, args.pid, args.rounds)
    else:
        from tests import real_model
        from tokenops.engine.models.default_model import smollm2_path
        from tokenops.testing_serve import ServeProcess

        if smollm2_path() is None:
            print("the default model's package is not installed (make install)")
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            config = hostile_cases.server_config(str(real_model.gguf_path()))
            with ServeProcess(tmp, config=config, admin_key=hostile_cases.ADMIN_KEY, env=real_model.SERVE_ENV) as srv:
                assert srv.proc is not None
                httpx.put(
                    f"{srv.url}/admin/tenants/{hostile_cases.TENANT}",
                    headers=hostile_cases.admin_headers(),
                    content=b"{}",
                )
                figures = run(srv.url, srv.proc.pid, args.rounds)
    print(json.dumps(figures, indent=2) if args.json else "", end="")
    print_table(figures)
    return 0 if all(f["num_5xx"] == 0 for f in figures["families"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
