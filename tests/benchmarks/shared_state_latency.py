"""What the shared state adds to a request, side by side with the embedded default in one run.

Two measurements, both on loopback (a throwaway ``redis-server``; PostgreSQL is measured by
tests/benchmarks/shared_chain_reads.py):

- **in process**: the shared-state work of one chat turn with session memory and the semantic
  cache on (``remember`` the user turn, ``recall`` for fitting, cache ``lookup`` of a new
  question, cache ``store`` of the answer) — the embedded default (:class:`SessionMemory`, a
  cache of this process) against ``[shared] redis_url`` (:class:`RedisSessionMemory`, the cache
  fed through a Redis stream). Turns alternate between the two so load on the box hits both alike;
  the figure is the p50 of the per-turn difference. One replica serves every turn, so its copies
  of the sessions (tokenops/shared_state/session_copies.py) are live;
- **in process, round robin**: session memory only, each turn on the other of two replicas (as a
  round-robin balancer sends them), so every turn reads its session from Redis;
- **through serve** (``--serve``): two real ``tokenops serve`` processes with the same config but
  for ``[shared] redis_url`` (an echo upstream behind both), the openai SDK sending the same turns
  to each in alternation; p50 end-to-end per request and the p50 of the paired difference;
  ``--keys`` adds a row where both also check a managed key with a budget and a tenant rate limit
  (in Redis on the shared one: ``[plugins.rate_limit] redis_url``, which the keys follow).

    .venv/bin/python tests/benchmarks/shared_state_latency.py --turns 400
    .venv/bin/python tests/benchmarks/shared_state_latency.py --turns 300 --serve --keys
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tokenops.memory.memory_store import SessionMemory  # noqa: E402
from tokenops.semcache.cache import SemanticCache  # noqa: E402
from tokenops.semcache.embedders import LexicalEmbedder  # noqa: E402
from tokenops.shared_state import redis_client  # noqa: E402
from tokenops.shared_state.redis_cache_feed import RedisCacheFeed  # noqa: E402
from tokenops.shared_state.redis_memory import RedisSessionMemory  # noqa: E402
from tokenops.testing_serve import redis_server  # noqa: E402
from tokenops.types import GatewayRequest, GatewayResponse  # noqa: E402


def _request(i: int, session: str) -> GatewayRequest:
    messages = [{"role": "user", "content": f"Question {i}: how many boats were in the harbour on day {i}?"}]
    return GatewayRequest(kind="chat", model="m", body={"messages": messages}, messages=messages, tenant="t",
                          session_id=session, max_tokens=16)


def _turn(memory: Any, cache: SemanticCache, i: int) -> float:
    request = _request(i, f"s{i % 20}")
    started = time.perf_counter()
    text = request.messages[0]["content"]
    memory.remember("t", request.session_id, [("user", text)])
    memory.recall("t", request.session_id, text)
    response, _ = cache.lookup(request)
    if response is None:
        cache.store(request, GatewayResponse(text=f"On day {i} six boats were moored.", model="m"))
    return time.perf_counter() - started


def in_process(url: str, turns: int) -> dict[str, float]:
    embed = LexicalEmbedder()
    embedded = (SessionMemory(embed.embed), SemanticCache(embed))
    shared_cache = SemanticCache(embed)
    feed = RedisCacheFeed(shared_cache, redis_client(url, timeout_s=5.0), prefix="bench")
    shared = (RedisSessionMemory(embed.embed, redis_client(url), prefix="bench"), shared_cache)
    for i in range(20):  # warm both (embedder, connections)
        _turn(*embedded, -1 - i)
        _turn(*shared, -1 - i)
    server = redis_client(url)
    commands = server.info("stats")["total_commands_processed"]
    local_s, shared_s = [], []
    for i in range(turns):
        local_s.append(_turn(*embedded, i))
        shared_s.append(_turn(*shared, i))
    commands = server.info("stats")["total_commands_processed"] - commands - 1
    feed.close()
    shared[0].close()
    pings = []
    for _ in range(turns):
        started = time.perf_counter()
        server.ping()
        pings.append(time.perf_counter() - started)
    # the feed's XREADs are not on a request's path: counted apart
    return {**_summary(local_s, shared_s), "commands_per_turn": commands / turns,
            "ping_p50_ms": statistics.median(pings) * 1000}


def round_robin(url: str, turns: int) -> dict[str, float]:
    """Session memory only, each turn of a session on the other of two replicas (as a round-robin
    balancer sends them): no turn finds its session as this replica last wrote it."""
    embed = LexicalEmbedder()
    embedded = SessionMemory(embed.embed)
    replicas = [RedisSessionMemory(embed.embed, redis_client(url), prefix="bench-rr") for _ in range(2)]

    def turn(memory: Any, i: int) -> float:
        text = f"Question {i}: how many boats were in the harbour on day {i}?"
        started = time.perf_counter()
        memory.remember("t", f"s{i % 20}", [("user", text)])
        memory.recall("t", f"s{i % 20}", text)
        return time.perf_counter() - started

    for i in range(20):
        turn(embedded, -1 - i)
        turn(replicas[i % 2], -1 - i)
    local_s, shared_s = [], []
    for i in range(turns):
        local_s.append(turn(embedded, i))
        replicas[(i // 20) % 2].flush()  # the other replica's write landed (the client read its answer)
        shared_s.append(turn(replicas[(i // 20 + 1) % 2], i))
    for replica in replicas:
        replica.close()
    return _summary(local_s, shared_s)


def through_serve(url: str, turns: int, workdir: Path, keys: bool = False) -> dict[str, float]:
    """``keys``: also a managed key with a budget and a tenant rate limit (Redis-backed on the
    shared gateway: one budget reserve and one rate-limit script per request)."""
    import httpx
    import openai
    from tests.gateway.openai_upstream import Upstream
    from tokenops.testing_serve import ServeProcess

    with Upstream() as up:
        base = (f'[[models]]\nname = "up"\nbackend = "openai"\nurl = "{up.url}"\ncost_input_per_1m = 1.0\n\n'
                '[plugins.session_memory]\nenabled = true\nembedder = "lexical"\n\n'
                '[plugins.semantic_cache]\nenabled = true\nembedder = "lexical"\n')
        limits = '\n[plugins.rate_limit]\nenabled = true\n{}[plugins.rate_limit.tenant]\nrequests_per_min = 1000000\n'
        embedded_config = base + (limits.format("") if keys else "")
        shared_config = base + f'\n[shared]\nredis_url = "{url}"\n'
        if keys:
            shared_config += limits.format(f'redis_url = "{url}"\n')
        tag = "keys-" if keys else ""
        with ServeProcess(workdir / f"{tag}embedded", config=embedded_config) as a, ServeProcess(
                workdir / f"{tag}shared", config=shared_config) as b:
            api_keys = ["x", "x"]
            if keys:  # a managed key with a budget on each (the shared one's ledger is in Redis)
                for n, srv in enumerate((a, b)):
                    admin = httpx.Client(base_url=srv.url, headers=srv.admin_headers, timeout=30)
                    admin.put("/admin/tenants/bench", json={}).raise_for_status()
                    created = admin.post("/admin/keys", json={"tenant": "bench", "budget_usd": 1000.0})
                    api_keys[n] = created.raise_for_status().json()["key"]
            clients = [openai.OpenAI(base_url=s.base_url, api_key=k, max_retries=0) for s, k in zip((a, b), api_keys)]

            def ask(client: openai.OpenAI, i: int) -> float:
                started = time.perf_counter()
                client.chat.completions.create(
                    model="up", max_tokens=8, extra_headers={"x-session-id": f"s{i % 20}"},
                    messages=[{"role": "user", "content": f"Question {i}: how many boats on day {i}?"}])
                return time.perf_counter() - started

            for i in range(20):
                ask(clients[0], -1 - i)
                ask(clients[1], -1 - i)
            local_s, shared_s = [], []
            for i in range(turns):
                local_s.append(ask(clients[0], i))
                shared_s.append(ask(clients[1], i))
    return _summary(local_s, shared_s)


def _summary(local_s: list[float], shared_s: list[float]) -> dict[str, float]:
    return {
        "embedded_p50_ms": statistics.median(local_s) * 1000,
        "shared_p50_ms": statistics.median(shared_s) * 1000,
        "added_p50_ms": statistics.median(s - e for s, e in zip(shared_s, local_s)) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--turns", type=int, default=400)
    ap.add_argument("--serve", action="store_true", help="also through two real tokenops serve processes")
    ap.add_argument("--keys", action="store_true", help="with --serve: also a row with a managed key's budget "
                    "and a tenant rate limit (in Redis on the shared gateway)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, redis_server(tmp) as url:
        rows = {"in process (memory + cache calls of a turn)": in_process(url, args.turns)}
        rows["in process, turns alternating over 2 replicas"] = round_robin(url, args.turns)
        if args.serve:
            rows["through serve (openai SDK, end to end)"] = through_serve(url, args.turns, Path(tmp))
        if args.serve and args.keys:
            rows["through serve + key budget + rate limit"] = through_serve(url, args.turns, Path(tmp), keys=True)
    print(f"{args.turns} turns, Redis on loopback; p50 per request")
    print(f"{'':46} {'embedded':>10} {'shared':>10} {'added':>10}")
    for name, r in rows.items():
        print(f"{name:46} {r['embedded_p50_ms']:8.3f}ms {r['shared_p50_ms']:8.3f}ms {r['added_p50_ms']:8.3f}ms")
    r = rows["in process (memory + cache calls of a turn)"]
    print(f"Redis commands per turn (the feed's reads and the script's own calls included): {r['commands_per_turn']:.1f}; "
          f"PING p50 {r['ping_p50_ms']:.3f} ms; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
