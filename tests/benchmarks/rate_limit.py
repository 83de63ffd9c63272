#!/usr/bin/env python
"""Rate limiter: accuracy under 4x over-limit load, Retry-After on every 429, fair
share between tenants, admission overhead, and one limit shared by two processes
through a real Redis server.

    .venv/bin/python tests/benchmarks/rate_limit.py
    .venv/bin/python tests/benchmarks/rate_limit.py --minutes 30 --no-redis

1. Accuracy (fake clock): one tenant limited to ``--tpm`` tokens/min offers 4x that
   for ``--minutes`` simulated minutes (requests estimated at prompt + max_tokens,
   real usage shorter and corrected at completion one second later); admitted real
   tokens/min vs the limit, and the share of 429s that carry Retry-After.
2. Fair share (fake clock): a global capacity shared by a flooding tenant (4x
   capacity), a light one (0.3x) and a weighted one (weight 2, 2x capacity).
3. Overhead: wall time of ``admit`` + ``complete`` in process and against Redis.
4. Redis: two processes hammer one 600 requests/min limit for 3 s; admitted in
   total vs the limit's allowance (burst + rate x time).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _req(tenant: str, prompt_chars: int, max_tokens: int):
    from tokenops.types import GatewayRequest

    m = [{"role": "user", "content": "x" * prompt_chars}]
    return GatewayRequest(kind="chat", model="m", body={"messages": m}, messages=m, tenant=tenant, max_tokens=max_tokens)


def accuracy(tpm: float, minutes: int) -> None:
    from tokenops.ratelimit.config import Limit, RateLimitConfig
    from tokenops.ratelimit.limiter import RateLimiter

    clock = Clock()
    rl = RateLimiter(RateLimitConfig(enabled=True, defaults={"tenant": Limit(tokens_per_min=tpm)}), clock=clock)
    rng = random.Random(0)
    per_request = 100 + 100  # estimate: 400 chars / 4 + max_tokens 100
    rate = 4 * tpm / 60 / per_request  # requests per second offered: 4x the limit by estimate
    step = 1.0 / rate
    in_flight, admitted, offered, rejections = [], 0, 0, []
    for i in range(int(minutes * 60 * rate)):
        clock.t = 1000.0 + i * step
        while in_flight and in_flight[0][0] <= clock.t:
            _, rid, actual = in_flight.pop(0)
            rl.complete(rid, actual)
        r = _req("flood", 400, 100)
        offered += 1
        rej = rl.admit(r)
        if rej is None:
            actual = 100 + rng.randint(20, 100)
            admitted += actual
            in_flight.append((clock.t + 1.0, r.id, actual))
        else:
            rejections.append(rej)
    per_min = admitted / minutes
    with_retry = sum(1 for r in rejections if r.retry_after_s and r.retry_after_s > 0)
    print(f"1. accuracy: limit {tpm:,.0f} tokens/min, offered {4 * tpm:,.0f}/min (by estimate) for {minutes} min")
    print(f"   admitted {per_min:,.0f} real tokens/min = {per_min / tpm:.3f} of the limit "
          f"(error {abs(per_min - tpm) / tpm:.1%}); {len(rejections):,} of {offered:,} requests refused, "
          f"{with_retry / max(1, len(rejections)):.0%} with Retry-After "
          f"(median {sorted(r.retry_after_s for r in rejections)[len(rejections) // 2]:.2f} s)")


def fair_share() -> None:
    from tokenops.ratelimit.fair_share import FairShare

    fs = FairShare(tokens_per_min=60_000, weights={"gold": 2.0}, window_s=10.0)
    offered = {"flood": 4000, "light": 300, "gold": 2000}  # tokens/s; capacity 1000/s
    got = dict.fromkeys(offered, 0.0)
    step = 0.01
    for i in range(int(120 / step)):
        now = i * step
        for tenant, rate in offered.items():
            tokens = rate * step
            if fs.wait_for(tenant, tokens, now) == 0:
                fs.take(tenant, tokens, now)
                if now >= 60:
                    got[tenant] += tokens
    total = sum(got.values()) / 60
    print("2. fair share: capacity 1,000 tokens/s; offered flood 4,000, light 300, gold (weight 2) 2,000")
    print("   got (tokens/s, second minute): " + ", ".join(f"{t} {v / 60:,.0f}" for t, v in got.items())
          + f"; total {total:,.0f} ({total / 1000:.0%} of capacity)"
          + "; weighted max-min fair answer: shares 1:1:2 of 1,000 -> flood 250, light 250, gold 500")


def overhead(redis_url: str | None) -> None:
    from tokenops.ratelimit.config import Limit, RateLimitConfig
    from tokenops.ratelimit.limiter import RateLimiter

    print("3. overhead of admit + complete (tenant rpm + tpm + concurrency)")
    limit = Limit(requests_per_min=1e9, tokens_per_min=1e12, max_concurrency=10_000)
    for label, url in (("in process", None), ("redis", redis_url)):
        if label == "redis" and url is None:
            continue
        rl = RateLimiter(RateLimitConfig(enabled=True, redis_url=url, defaults={"tenant": limit}))
        times = []
        for _ in range(2000):
            r = _req("bench", 400, 100)
            t = time.perf_counter()
            assert rl.admit(r) is None
            rl.complete(r.id, 150)
            times.append(time.perf_counter() - t)
        times.sort()
        print(f"   {label:<10} p50 {times[1000] * 1e6:7.0f} us   p99 {times[1980] * 1e6:7.0f} us")


WORKER = Path(__file__).resolve().parents[1] / "compute_network" / "test_rate_limit_redis.py"


def redis_shared(seconds: float = 3.0) -> str | None:
    binary = shutil.which("redis-server")
    if binary is None:
        print("4. redis: no redis-server binary (apt-get install -y redis-server); skipped")
        return None
    try:
        import redis
    except ImportError:
        print("4. redis: the redis client is not installed (pip install 'tokenops[redis]'); skipped")
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    url = f"redis://127.0.0.1:{port}/0"
    sys.path.insert(0, str(WORKER.parent))
    from test_rate_limit_redis import WORKER as code

    start_at = time.time() + 5.0
    procs = [subprocess.Popen([sys.executable, "-c", code, url, str(start_at), str(seconds)], stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    total = sum(r["admitted"] for r in results)
    window = max(r["last"] for r in results) - min(r["first"] for r in results)
    allowance = 10 + 10 * window  # burst (1 s at 10/s) + rate x time both ran
    print(f"4. redis: two processes, one 600 requests/min limit (burst 1 s), {window:.2f} s: admitted "
          f"{[r['admitted'] for r in results]} = {total} vs allowance {allowance:.0f} ({total / allowance:.2f}x); "
          f"separate in-process limits would allow {2 * allowance:.0f}; every 429 had Retry-After: "
          f"{all(r['retry_ok'] for r in results)}")
    overhead(url)
    proc.terminate()
    proc.wait(timeout=5)
    shutil.rmtree(tmp, ignore_errors=True)
    return url


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tpm", type=float, default=60_000)
    p.add_argument("--minutes", type=int, default=10)
    p.add_argument("--no-redis", action="store_true")
    args = p.parse_args()
    accuracy(args.tpm, args.minutes)
    fair_share()
    if args.no_redis or redis_shared() is None:
        overhead(None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
