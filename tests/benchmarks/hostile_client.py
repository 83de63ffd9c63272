"""A hostile client against a real ``tokenops serve``: does any request grow the server's
memory or stall its event loop?

Workers loop over :data:`CASES` (schemas that size or multiply the answer, recursive
schemas, big enums, long embedding inputs, deep or huge-number admin bodies, window
parameters out of range, bad field types) while a probe asks ``/health`` every 20 ms
and a sampler reads the server's resident memory from ``/proc``. Printed: requests and
status codes per case, 5xx count, RSS at start / peak / growth, ``/health`` p50 / p99 /
max (RSS after one warm-up pass of every case: the embedding model loads on first use).
Goals (issue 42): RSS growth <= 256 MiB, ``/health`` p99 < 50 ms, 0 5xx.

    .venv/bin/python tests/benchmarks/hostile_client.py --seconds 60 --workers 2

Without ``--url`` it starts its own server (the demo chat model and MiniLM embeddings,
an API key, the admin key); ``--url URL --pid PID`` measures a running one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

import httpx

API_KEY = "hostile-api-key-123"
ADMIN_KEY = "hostile-admin-key-123"
CHAT_MODEL = "demo"
EMBED_MODEL = "minilm"


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, **extra}


def _schema_format(schema: Any) -> dict[str, Any]:
    return _chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def _forced_tool(parameters: Any) -> dict[str, Any]:
    return _chat(tools=[{"type": "function", "function": {"name": "f", "parameters": parameters}}],
                 tool_choice={"type": "function", "function": {"name": "f"}})


def _nested(depth: int) -> bytes:
    return b'{"budget_usd": ' + b"[" * depth + b"]" * depth + b"}"


SELF_REF = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}
#: name -> (method, path, json body or raw bytes, which key: "api" | "admin")
CASES: dict[str, tuple[str, str, Any, str]] = {
    "minLength 1e9": ("POST", "/v1/chat/completions",
                      _schema_format({"type": "string", "minLength": 1_000_000_000}), "api"),
    "minLength 3e7 in object": ("POST", "/v1/chat/completions", _schema_format(
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 30_000_000}}, "required": ["a"]}), "api"),
    "tools minLength 5e6": ("POST", "/v1/chat/completions", _forced_tool(
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 5_000_000}}, "required": ["a"]}), "api"),
    "minItems 3000x3000": ("POST", "/v1/chat/completions", _schema_format(
        {"type": "array", "minItems": 3000, "items": {"type": "array", "minItems": 3000, "items": {"type": "integer"}}}),
        "api"),
    "minProperties 1e8": ("POST", "/v1/chat/completions",
                          _schema_format({"type": "object", "minProperties": 100_000_000}), "api"),
    "pattern a{1e7}": ("POST", "/v1/chat/completions",
                       _schema_format({"type": "string", "pattern": "^a{10000000}$"}), "api"),
    "self-ref response_format": ("POST", "/v1/chat/completions", _schema_format(SELF_REF), "api"),
    "self-ref tools": ("POST", "/v1/chat/completions", _forced_tool(SELF_REF), "api"),
    "enum 100k": ("POST", "/v1/chat/completions", _schema_format({"enum": list(range(100_000))}), "api"),
    "const 2 MB": ("POST", "/v1/chat/completions", _schema_format({"const": "c" * 2_000_000}), "api"),
    "schema nesting 3000": ("POST", "/v1/chat/completions",
                            _schema_format(json.loads('{"items":' * 150 + "{}" + "}" * 150)), "api"),
    "embeddings 3.9 MB": ("POST", "/v1/embeddings", {"model": EMBED_MODEL, "input": "word " * 780_000}, "api"),
    "embeddings 2048 x 1.9 kB": ("POST", "/v1/embeddings",
                                 {"model": EMBED_MODEL, "input": ["lorem ipsum " * 160] * 2048}, "api"),
    "seed 2^64+1": ("POST", "/v1/chat/completions", _chat(seed=2**64 + 1), "api"),
    "cache 'yes'": ("POST", "/v1/chat/completions", _chat(cache="yes"), "api"),
    "user without content": ("POST", "/v1/chat/completions",
                             {"model": CHAT_MODEL, "messages": [{"role": "user"}]}, "api"),
    "admin tenant 10k-deep": ("PUT", "/admin/tenants/hostile", _nested(10_000), "admin"),
    "admin key 4300-digit int": ("POST", "/admin/keys",
                                 b'{"tenant": "hostile", "rpm": ' + b"9" * 4300 + b"}", "admin"),
    "admin since=999999999999d": ("GET", "/admin/query/usage_by_model_day?since=999999999999d", None, "admin"),
    "admin since=0001-01-01T00:00:00+14:00": ("GET", "/admin/query/usage_by_model_day?since=0001-01-01T00:00:00%2B14:00",
                                              None, "admin"),
    "admin limit=0": ("GET", "/admin/requests?limit=0", None, "admin"),
}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


_ENCODED: dict[str, bytes | None] = {}


def _send(client: httpx.Client, name: str) -> int:
    method, path, body, key = CASES[name]
    headers = {"authorization": f"Bearer {API_KEY if key == 'api' else ADMIN_KEY}",
               "content-type": "application/json"}
    if name not in _ENCODED:  # encoded once: the client's own work must not slow its probe
        _ENCODED[name] = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    return client.request(method, path, content=_ENCODED[name], headers=headers).status_code


def _probe(url: str, pid: int, stop: Any, out: Any) -> None:
    """``/health`` every 20 ms and the server's RSS, in its own process (the workers'
    GIL would otherwise delay the probe, not the server)."""
    health, rss = [], []
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            client.get("/health")
            health.append(time.perf_counter() - t0)
            rss.append(rss_bytes(pid))
            time.sleep(0.02)
    out.put((health, rss))


def run(url: str, pid: int, seconds: float, workers: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Loop the cases for ``seconds`` with ``workers`` threads; returns the figures."""
    with httpx.Client(base_url=url, timeout=120) as client:  # warm-up: lazy model loads are no growth
        for name in CASES:
            _send(client, name)
    stop = threading.Event()
    statuses: dict[str, Counter] = defaultdict(Counter)
    health: list[float] = []
    rss: list[int] = [rss_bytes(pid)]
    lock = threading.Lock()

    def worker(offset: int) -> None:
        names = list(CASES)
        with httpx.Client(base_url=url, timeout=120) as client:
            i = offset
            while not stop.is_set():
                name = names[i % len(names)]
                i += 1
                try:
                    code = _send(client, name)
                except httpx.HTTPError as e:
                    code = f"error {type(e).__name__}"
                with lock:
                    statuses[name][code] += 1

    ctx = multiprocessing.get_context("spawn")
    probe_stop, probe_out = ctx.Event(), ctx.Queue()
    prober = ctx.Process(target=_probe, args=(url, pid, probe_stop, probe_out))
    prober.start()
    threads = [threading.Thread(target=worker, args=(k * 3,)) for k in range(workers)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    probe_stop.set()
    for t in threads:
        t.join()
    probed_health, probed_rss = probe_out.get(timeout=60)
    prober.join()
    health += probed_health
    rss += probed_rss
    rss.append(rss_bytes(pid))
    health.sort()
    figures = {
        "requests": sum(sum(c.values()) for c in statuses.values()),
        "num_5xx": sum(n for c in statuses.values() for code, n in c.items() if not isinstance(code, int) or code >= 500),
        "rss_start_mib": rss[0] / 2**20, "rss_peak_mib": max(rss) / 2**20,
        "rss_growth_mib": (max(rss) - rss[0]) / 2**20,
        "health_p50_ms": 1000 * statistics.median(health), "health_p99_ms": 1000 * health[int(0.99 * (len(health) - 1))],
        "health_max_ms": 1000 * health[-1], "health_probes": len(health),
        "statuses": {name: dict(c) for name, c in statuses.items()},
    }
    for name, counts in figures["statuses"].items():
        log(f"  {name:42s} {counts}")
    log(f"requests {figures['requests']}, 5xx {figures['num_5xx']}; RSS {figures['rss_start_mib']:.0f} MiB -> peak "
        f"{figures['rss_peak_mib']:.0f} MiB (growth {figures['rss_growth_mib']:.0f} MiB, goal <= 256); /health p50 "
        f"{figures['health_p50_ms']:.1f} ms, p99 {figures['health_p99_ms']:.1f} ms (goal < 50), max "
        f"{figures['health_max_ms']:.1f} ms over {figures['health_probes']} probes")
    return figures


def server_config() -> str:
    from tokenops.engine.models.default_model import shipped_model_dir

    return (f'[[models]]\nname = "{CHAT_MODEL}"\nbackend = "local"\npath = "{shipped_model_dir()}"\n\n'
            f'[[models]]\nname = "{EMBED_MODEL}"\nbackend = "embedding"\n\n'
            f'[gateway]\napi_keys = {{ "{API_KEY}" = "hostile" }}\n')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (else one is started)")
    parser.add_argument("--pid", type=int, help="its process id (for RSS)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.url:
        if args.pid is None:
            parser.error("--url needs --pid (the server's process, for RSS)")
        figures = run(args.url, args.pid, args.seconds, args.workers)
    else:
        import tempfile

        from tokenops.testing_serve import ServeProcess

        with tempfile.TemporaryDirectory() as tmp:
            with ServeProcess(tmp, config=server_config(), admin_key=ADMIN_KEY) as srv:
                httpx.put(f"{srv.url}/admin/tenants/hostile", headers={"x-admin-key": ADMIN_KEY}, content=b"{}")
                assert srv.proc is not None
                figures = run(srv.url, srv.proc.pid, args.seconds, args.workers)
    if args.json:
        print(json.dumps(figures, indent=2))
    return 0 if figures["num_5xx"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
