"""Gateway overhead: tokenops vs the LiteLLM proxy in front of the same fast mock upstream.

Everything runs on loopback in separate processes:

- a mock OpenAI upstream (raw asyncio HTTP/1.1, keep-alive) answering
  ``/v1/chat/completions`` at once with a fixed completion (JSON, or SSE when
  ``stream`` is true);
- ``tokenops serve --model bench-model=<upstream>`` (store enabled, as deployed);
- ``litellm --config <file>`` pointing at the same upstream (installed on first
  run, pinned to LITELLM_VERSION, into /tmp/tokenops-litellm-VERSION-venv;
  ``--skip-litellm`` leaves it out).

Measured per target (the upstream called directly is the baseline):

- latency: sequential requests on one keep-alive connection; p50/p99 of the
  whole request, non-streamed and streamed; overhead = target - direct;
- throughput: closed loop at several concurrencies for a bounded number of
  requests; the highest completed requests/second.

Goal (issue 4): tokenops adds at most 1/5 of LiteLLM's p50 overhead and
sustains at least 2x its RPS. ``--tracing`` adds a second tokenops exporting every request's
trace (OpenTelemetry, OTLP/HTTP) to a real receiver in its own process (tests/gateway/otlp_receiver.py,
decoding each export); goal (issue 37): tracing adds at most 0.3 ms p50. Run::

    .venv/bin/python tests/benchmarks/gateway_overhead.py            # full run
    .venv/bin/python tests/benchmarks/gateway_overhead.py --quick    # fewer requests
    .venv/bin/python tests/benchmarks/gateway_overhead.py --quick --skip-litellm --tracing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Pinned: PyPI releases 1.82.7 and 1.82.8 shipped a credential stealer; 1.106.2 ran here.
LITELLM_VERSION = "1.106.2"
LITELLM_VENV = Path(f"/tmp/tokenops-litellm-{LITELLM_VERSION}-venv")
MODEL = "bench-model"
#: Both gateways authenticate the same API key (LiteLLM refuses to start without one).
API_KEY = "sk-" + "0123456789abcdef" * 4
REPLY = "The quick brown fox jumps over the lazy dog."

# --------------------------------------------------------------------------- mock upstream


def _completion_json() -> bytes:
    return json.dumps({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 1700000000, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 10, "total_tokens": 22},
    }).encode()


def _completion_sse() -> bytes:
    head = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1700000000, "model": MODEL}
    events = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    for word in REPLY.split(" "):
        events.append({**head, "choices": [{"index": 0, "delta": {"content": word + " "}, "finish_reason": None}]})
    events.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    events.append({**head, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 10, "total_tokens": 22}})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _http(status: str, body: bytes, ctype: str) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
            f"connection: keep-alive\r\n\r\n").encode() + body


async def _serve_upstream(port: int) -> None:
    json_reply = _http("200 OK", _completion_json(), "application/json")
    sse_reply = _http("200 OK", _completion_sse(), "text/event-stream")
    models = _http("200 OK", json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode(),
                   "application/json")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                if lines[0].startswith("GET"):
                    writer.write(models)
                else:
                    writer.write(sse_reply if b'"stream":true' in body.replace(b" ", b"") else json_reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


# --------------------------------------------------------------------------- load client


class Connection:
    """One keep-alive HTTP/1.1 connection; reads content-length and chunked bodies."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, body: bytes, path: str = "/v1/chat/completions") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write((f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                           f"authorization: Bearer {API_KEY}\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body)
        assert self.reader is not None
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        status = int(head.split(" ", 2)[1])
        if "transfer-encoding: chunked" in head:
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                data = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(data[:-2])
            payload = b"".join(parts)
        else:
            length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
            payload = await self.reader.readexactly(length)
        if "connection: close" in head:
            self.close()
        return status, payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _body(stream: bool) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Say something."}],
                       "max_tokens": 16, "stream": stream}).encode()


async def _latency(port: int, num: int, stream: bool) -> list[float]:
    conn, body, out = Connection(port), _body(stream), []
    for _ in range(max(20, num // 10)):  # warm-up
        status, payload = await conn.request(body)
        assert status == 200, payload[:300]
    for _ in range(num):
        t0 = time.perf_counter()
        status, payload = await conn.request(body)
        out.append(time.perf_counter() - t0)
        assert status == 200 and (b"[DONE]" in payload if stream else b'"choices"' in payload), payload[:300]
    conn.close()
    return out


async def _throughput(port: int, concurrency: int, num: int) -> float:
    body, remaining = _body(False), [num]

    async def worker() -> int:
        conn, done = Connection(port), 0
        while remaining[0] > 0:
            remaining[0] -= 1
            status, _ = await conn.request(body)
            done += status == 200
        conn.close()
        return done

    t0 = time.perf_counter()
    done = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
    return done / (time.perf_counter() - t0)


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round((len(s) - 1) * p / 100)))]


# --------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 180.0, path: str = "/health") -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}; see its log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.3)
    raise SystemExit(f"{what} did not come up on port {port} within {timeout:.0f} s")


def ensure_litellm() -> Path:
    exe = LITELLM_VENV / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"installing litellm[proxy] into {LITELLM_VENV} (a few minutes, once) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"], check=True)
    return exe


def start_tokenops(upstream: int, port: int, workdir: Path, otlp_port: int | None = None) -> subprocess.Popen:
    env = dict(os.environ, TOKENOPS_ADMIN_KEY="bench-admin")
    cfg = workdir / f"tokenops-{port}.toml"
    text = f'[gateway.api_keys]\n"{API_KEY}" = "bench"\n'
    if otlp_port is not None:
        text += f'[telemetry]\notlp_endpoint = "http://127.0.0.1:{otlp_port}"\n'
    cfg.write_text(text)
    log = open(workdir / f"tokenops-{port}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "tokenops", "serve", "--config", str(cfg),
                             "--model", f"{MODEL}=http://127.0.0.1:{upstream}",
                             "--port", str(port), "--store", str(workdir / "store" / f"bench-{port}.duckdb")],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)


def start_litellm(exe: Path, upstream: int, port: int, workdir: Path) -> subprocess.Popen:
    cfg = workdir / "litellm.yaml"
    cfg.write_text(f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
                   f"      api_base: http://127.0.0.1:{upstream}/v1\n      api_key: sk-mock\n"
                   "litellm_settings:\n  drop_params: true\n  telemetry: false\n")
    env = dict(os.environ, LITELLM_MASTER_KEY=API_KEY, LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False", DISABLE_ADMIN_UI="True",
               LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("DATABASE_URL", None)
    log = open(workdir / "litellm.log", "w")
    return subprocess.Popen([str(exe), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
                             "--num_workers", "1"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)


# --------------------------------------------------------------------------- main


def measure(name: str, port: int, args: argparse.Namespace) -> dict:
    lat = asyncio.run(_latency(port, args.num_latency, stream=False))
    lat_s = asyncio.run(_latency(port, args.num_latency // 2, stream=True))
    rps = max(asyncio.run(_throughput(port, c, args.num_rps)) for c in args.concurrency)
    row = {"target": name, "p50_ms": _pct(lat, 50) * 1e3, "p99_ms": _pct(lat, 99) * 1e3,
           "stream_p50_ms": _pct(lat_s, 50) * 1e3, "stream_p99_ms": _pct(lat_s, 99) * 1e3,
           "mean_ms": statistics.fmean(lat) * 1e3, "rps": rps}
    print(f"  {name:9s} p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  stream p50 "
          f"{row['stream_p50_ms']:7.2f} ms  max {rps:7.0f} req/s", flush=True)
    return row


def tracing_rounds(plain: int, traced: int, args: argparse.Namespace, rounds: int = 7) -> list[dict]:
    """Tracing's added p50, in rounds that alternate the two servers (plain first, then traced, then
    the other way round), so a shared machine's changing load hits both alike; the median is reported."""
    out = []
    for i in range(rounds):
        order = [(plain, "plain"), (traced, "traced")]
        p50 = {}
        for stream in (False, True):
            for port, name in (order if i % 2 == 0 else order[::-1]):
                p50[(name, stream)] = _pct(asyncio.run(_latency(port, args.num_latency // 2, stream=stream)), 50) * 1e3
        out.append({"added_p50_ms": p50[("traced", False)] - p50[("plain", False)],
                    "added_stream_p50_ms": p50[("traced", True)] - p50[("plain", True)]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    ap.add_argument("--skip-litellm", action="store_true", help="measure tokenops only")
    ap.add_argument("--mock-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    ap.add_argument("--tracing", action="store_true", help="also tokenops exporting traces to an OTLP receiver")
    ap.add_argument("--otlp-receiver", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mock_upstream:
        asyncio.run(_serve_upstream(args.mock_upstream))
        return
    if args.otlp_receiver:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.gateway.otlp_receiver import Receiver

        with Receiver(args.otlp_receiver) as receiver:
            while True:
                time.sleep(5)
                receiver.spans.clear()  # decoded and dropped: memory stays flat over a long run
    args.num_latency = 200 if args.quick else 1000
    args.num_rps = 1000 if args.quick else 4000
    args.concurrency = (16,) if args.quick else (8, 32, 128)

    litellm = None if args.skip_litellm else ensure_litellm()
    workdir = Path(tempfile.mkdtemp(prefix="tokenops-gw-bench-"))
    up_port, to_port, ll_port = _free_port(), _free_port(), _free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--mock-upstream", str(up_port)])]
    try:
        _wait_port(up_port, procs[0], "mock upstream", path="/v1/models")
        procs.append(start_tokenops(up_port, to_port, workdir))
        if litellm:
            procs.append(start_litellm(litellm, up_port, ll_port, workdir))
        if args.tracing:
            otlp_port, tr_port = _free_port(), _free_port()
            procs.append(subprocess.Popen([sys.executable, __file__, "--otlp-receiver", str(otlp_port)]))
            procs.append(start_tokenops(up_port, tr_port, workdir, otlp_port))
            _wait_port(tr_port, procs[-1], "tokenops serve (tracing)", path="/ready")
        _wait_port(to_port, procs[1], "tokenops serve", path="/ready")
        if litellm:
            _wait_port(ll_port, procs[2], "litellm", path="/health/liveliness")
        time.sleep(5.0)  # let start-up work (imports, first cost-map loads) finish before timing
        print(f"gateway overhead benchmark (logs in {workdir}); {os.cpu_count()} CPUs, loopback", flush=True)
        targets = [("direct", up_port), ("tokenops", to_port)] + ([("litellm", ll_port)] if litellm else [])
        targets += [("tok+otel", tr_port)] if args.tracing else []
        rows = [measure(name, port, args) for name, port in targets]
        if args.tracing:
            rows[0]["tracing_rounds"] = tracing_rounds(to_port, tr_port, args)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    report(rows, as_json=args.json)


def report(rows: list[dict], as_json: bool = False) -> None:
    direct = rows[0]
    print()
    print(f"{'target':10s} {'p50 ms':>8s} {'p99 ms':>8s} {'+p50 ms':>8s} {'+p99 ms':>8s} {'+stream p50':>12s} {'max RPS':>9s}")
    for r in rows:
        r["overhead_p50_ms"] = r["p50_ms"] - direct["p50_ms"]
        r["overhead_p99_ms"] = r["p99_ms"] - direct["p99_ms"]
        r["overhead_stream_p50_ms"] = r["stream_p50_ms"] - direct["stream_p50_ms"]
        print(f"{r['target']:10s} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['overhead_p50_ms']:8.2f} "
              f"{r['overhead_p99_ms']:8.2f} {r['overhead_stream_p50_ms']:12.2f} {r['rps']:9.0f}")
    by = {r["target"]: r for r in rows}
    if "litellm" in by:
        t, ll = by["tokenops"], by["litellm"]
        ratio = t["overhead_p50_ms"] / ll["overhead_p50_ms"] if ll["overhead_p50_ms"] > 0 else float("nan")
        rps_ratio = t["rps"] / ll["rps"]
        print()
        print(f"tokenops p50 overhead / LiteLLM p50 overhead = {ratio:.3f}  (goal <= 0.2: "
              f"{'met' if ratio <= 0.2 else 'NOT met'})")
        print(f"tokenops max RPS / LiteLLM max RPS          = {rps_ratio:.2f}  (goal >= 2: "
              f"{'met' if rps_ratio >= 2 else 'NOT met'})")
    if "tok+otel" in by:
        rounds = direct.get("tracing_rounds") or []
        added = statistics.median(r["added_p50_ms"] for r in rounds)
        added_s = statistics.median(r["added_stream_p50_ms"] for r in rounds)
        each = ", ".join(f"{r['added_p50_ms']:.2f}" for r in rounds)
        print(f"tracing adds {added:.3f} ms p50 ({added_s:.3f} ms streamed), median of {len(rounds)} alternating rounds "
              f"(each: {each})  (goal <= 0.3: "
              f"{'met' if added <= 0.3 else 'NOT met'})")
    if as_json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
