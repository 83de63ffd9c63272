"""The operator's loop against a real ``tokenops serve`` (bundled demo engine), timed.

``levels``: ``tokenops bench --rate R,R`` (two identical levels) N times, default fresh
prompts next to ``--reuse-prompts`` (the old behaviour, the peer): TTFT p50 per level, how
far apart the two levels are, and each level's prefix-cache hit rate from /metrics.
Identical levels should agree within noise; with reused prompts the second level
measures the cache the first one warmed.

``tune``: ``tokenops tune --slo p95=200ms`` with no other flag next to the server (found
through its store socket), wall time against the 10-minute goal, and the verdict lines.

Run: .venv/bin/python tests/benchmarks/operator_loop.py levels [--runs 2 --rate 3 -n 60]
     .venv/bin/python tests/benchmarks/operator_loop.py tune
Figures on a shared 2-core box are as noisy as the box; say so when reporting them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tokenops.testing_serve import ServeProcess  # noqa: E402


def _cli(workdir: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TOKENOPS_STORE", "TOKENOPS_URL", "TOKENOPS_ADMIN_KEY")}
    env["TOKENOPS_STORE"] = str(workdir / "store" / "tokenops.duckdb")
    return subprocess.run([sys.executable, "-m", "tokenops", *args], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=timeout)


def levels(workdir: Path, runs: int, rate: float, num: int) -> None:
    print(f"tokenops bench --rate {rate:g},{rate:g} -n {num}, {runs} run(s) per mode, against tokenops serve")
    print(f"{'mode':<16}{'run':>4}{'TTFT p50 L1':>13}{'L2':>8}{'apart':>8}{'prefix L1':>11}{'L2':>6}")
    with ServeProcess(workdir):
        for mode, extra in (("fresh (default)", []), ("--reuse-prompts", ["--reuse-prompts"])):
            for run in range(runs):
                r = _cli(workdir, "bench", "--rate", f"{rate:g},{rate:g}", "-n", str(num), "--json", *extra)
                if r.returncode != 0:
                    raise SystemExit(r.stderr)
                lv = [x["summary"] for x in json.loads(r.stdout)["levels"]]
                t = [x["latency"]["ttft"]["p50"] * 1000 for x in lv]
                hits = ["-" if x["prefix_cache_hit_rate"] is None else f"{x['prefix_cache_hit_rate']:.0%}" for x in lv]
                apart = abs(t[0] - t[1]) / max(t)
                print(f"{mode:<16}{run + 1:>4}{t[0]:>11.0f}ms{t[1]:>6.0f}ms{apart:>8.0%}{hits[0]:>11}{hits[1]:>6}")


def tune(workdir: Path) -> None:
    with ServeProcess(workdir):
        t0 = time.monotonic()
        r = _cli(workdir, "tune", "--slo", "p95=200ms", timeout=900)
        elapsed = time.monotonic() - t0
    print(f"tokenops tune --slo p95=200ms next to tokenops serve: exit {r.returncode}, {elapsed:.0f} s "
          f"(goal < 600 s: {'ok' if elapsed < 600 else 'OVER'})")
    for line in r.stdout.splitlines():
        if line.startswith(("default:", "winner", "nothing met", "profile written")) or " trials in " in line:
            print("  " + line)
    if r.returncode != 0:
        print(r.stderr[-2000:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["levels", "tune"])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("-n", type=int, default=60)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="operator-loop-") as d:
        if args.what == "levels":
            levels(Path(d), args.runs, args.rate, args.n)
        else:
            tune(Path(d))


if __name__ == "__main__":
    main()
