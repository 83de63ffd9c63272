"""Added latency of managed-key and budget checks per request (issue 25).

What a request with a managed key and a spend budget costs the gateway beyond a
request with a ``[gateway] api_keys`` key and no budget, measured in-process on
the exact code the gateway runs per request:

- auth: ``ApiKeys.tenant_for`` (SHA-256 of the key, registry refresh - one Redis
  ``GET`` of the version with Redis -, lookup, revoked/expired check);
- admission: ``KeyGuard.admit`` (model list, cost estimate, atomic reservation in
  the key's daily budget and the tenant's rolling 24 h window of 60 buckets - one Lua
  script with Redis);
- settlement: ``KeyGuard.settle`` (the recorded cost replaces the estimate -
  one pipelined INCRBYFLOAT per ledger with Redis).

Baseline in the same run: ``tenant_for`` with a config key (what every request
already paid). Added = p50(managed path) - p50(baseline). Goals: < 0.2 ms p50
without Redis, < 1 ms with (loopback redis-server). No peer is measured: LiteLLM's
proxy keeps keys and budgets in Postgres and needs a database to compare against.

    .venv/bin/python tests/benchmarks/key_budget_overhead.py [--requests 5000] [--no-redis]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def measure(num_requests: int, redis_client=None) -> dict[str, float]:
    from tokenops.gateway.auth import ApiKeys
    from tokenops.keys.guard import KeyGuard
    from tokenops.keys.ledger import LocalLedger, RedisLedger
    from tokenops.keys.registry import BudgetClock, KeyRegistry
    from tokenops.keys.service import KeyService
    from tokenops.types import GatewayRequest

    if redis_client is not None:
        redis_client.flushdb()
    registry = KeyRegistry(None, redis_client, clock=BudgetClock())
    registry.put_tenant("acme", {"budget_usd": 1e9, "budget_period": "24h"})  # a rolling window: 60 buckets
    key, secret = registry.create({"tenant": "acme", "models": ["small", "auto"], "budget_usd": 1e9,
                                   "budget_period": "daily", "soft_budget_usd": 1e9})
    ledger = RedisLedger(redis_client) if redis_client is not None else LocalLedger()
    service = KeyService(registry, KeyGuard(registry, ledger, {"small": (0.15, 0.6)}))
    managed = ApiKeys({}, managed=service)
    static = ApiKeys({"tok-static-config-key": "acme"})
    managed_headers = {"authorization": f"Bearer {secret}"}
    static_headers = {"authorization": "Bearer tok-static-config-key"}
    messages = [{"role": "user", "content": "Summarise the plot of Hamlet in two sentences."}]

    def managed_path() -> float:
        t0 = time.perf_counter()
        tenant, key_id = managed.tenant_for(managed_headers, "127.0.0.1")
        req = GatewayRequest(kind="chat", model="small", body={}, messages=messages, tenant=tenant,
                             api_key_id=key_id, max_tokens=128)
        assert service.guard.admit(req) is None
        service.guard.settle(req.id, 0.0001, tenant, key_id)
        return time.perf_counter() - t0

    def baseline_path() -> float:
        t0 = time.perf_counter()
        tenant, key_id = static.tenant_for(static_headers, "127.0.0.1")
        GatewayRequest(kind="chat", model="small", body={}, messages=messages, tenant=tenant, api_key_id=key_id,
                       max_tokens=128)
        return time.perf_counter() - t0

    for _ in range(200):  # warm-up
        managed_path()
        baseline_path()
    managed_s, baseline_s = [], []
    for _ in range(num_requests):  # interleaved so load drift hits both alike
        managed_s.append(managed_path())
        baseline_s.append(baseline_path())
    return {"managed_p50_ms": statistics.median(managed_s) * 1e3, "managed_p95_ms": _percentile(managed_s, 0.95) * 1e3,
            "baseline_p50_ms": statistics.median(baseline_s) * 1e3,
            "added_p50_ms": (statistics.median(managed_s) - statistics.median(baseline_s)) * 1e3}


def redis_parts(client, num_requests: int) -> dict[str, float]:
    """The round trips one at a time: the registry's version GET and the reservation
    script for two fixed periods, and for a fixed period plus a 60-bucket rolling window."""
    from tokenops.keys.ledger import RedisLedger

    ledger = RedisLedger(client)
    fixed = [(("bench:a",), 1e9), (("bench:b",), 1e9)]
    rolling = [(("bench:a",), 1e9), (tuple(f"bench:r{i}" for i in range(60)), 1e9)]
    out = {}
    for name, call in (("version GET", lambda: client.get("bench:version")),
                       ("reserve (2 fixed)", lambda: ledger.reserve(fixed, 1e-6)),
                       ("reserve (fixed + rolling)", lambda: ledger.reserve(rolling, 1e-6)),
                       ("settle (queued to a thread)", lambda: ledger.adjust(["bench:a", "bench:b"], -1e-7))):
        times = []
        for _ in range(num_requests):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times) * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis measurement")
    args = parser.parse_args()
    rows = [("in-process (no Redis)", measure(args.requests), 0.2)]
    parts: dict[str, float] = {}
    if not args.no_redis:
        from tokenops.testing_serve import RedisUnavailable, redis_server

        try:
            with tempfile.TemporaryDirectory() as tmp, redis_server(tmp) as url:
                import redis

                client = redis.Redis.from_url(url)
                rows.append(("Redis (loopback)", measure(args.requests, client), 1.0))
                parts = redis_parts(client, args.requests)
        except RedisUnavailable as e:
            print(f"{e}: the Redis measurement is skipped")
    print(f"key + budget checks per request, {args.requests} requests each (auth + admit + settle)")
    print(f"{'ledger':<24}{'added p50 ms':>14}{'managed p50':>13}{'managed p95':>13}{'baseline p50':>14}{'goal':>8}  verdict")
    for name, r, goal in rows:
        verdict = "met" if r["added_p50_ms"] < goal else "NOT met"
        print(f"{name:<24}{r['added_p50_ms']:>14.4f}{r['managed_p50_ms']:>13.4f}{r['managed_p95_ms']:>13.4f}"
              f"{r['baseline_p50_ms']:>14.4f}{'<' + str(goal):>8}  {verdict}")
    if parts:
        print("Redis round trips alone, p50 ms: " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()))


if __name__ == "__main__":
    main()
