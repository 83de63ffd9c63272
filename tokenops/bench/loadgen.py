"""The load generator: streams requests to an OpenAI-compatible server and
times every token.

One pooled :class:`httpx.AsyncClient` per run. Requests are sent on an arrival
schedule (open loop: a slow server builds a queue, as real traffic does) or by
a fixed number of workers (closed loop, ``concurrency``). Multi-turn
conversations send each turn after the previous answer, with that answer in
the history.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tokenops.bench.arrivals import ArrivalSpec
from tokenops.bench.metrics import RequestResult
from tokenops.bench.request import BenchRequest

ENDPOINTS = ("chat", "completions")


class BenchError(RuntimeError):
    """The target cannot be benchmarked (unreachable, no model); one-line message."""


@dataclass(slots=True)
class LoadSpec:
    """Where and how to send a run's requests."""

    url: str
    model: str
    endpoint: str = "chat"
    api_key: str | None = None
    #: Open-loop schedule; None with ``concurrency`` set means closed loop.
    arrival: ArrivalSpec | None = None
    #: Closed loop: keep this many requests in flight.
    concurrency: int | None = None
    #: Open loop: never more than this many in flight (None = unbounded).
    max_in_flight: int | None = None
    #: Closed loop: pause between one answer ending and the same worker's next request
    #: (a client's "think time"; 0 sends at once).
    think_time_s: float = 0.0
    #: Closed loop: start the workers evenly over this many seconds instead of all at
    #: once (worker k waits k * ramp / concurrency), so they do not stay in lockstep.
    ramp_up_s: float = 0.0
    timeout_s: float = 300.0
    temperature: float | None = 0.0
    #: Ask the server to ignore EOS so answers have the requested length (vLLM/tokenops extension).
    ignore_eos: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise BenchError(f"unknown endpoint {self.endpoint!r}; use chat or completions")
        if (self.arrival is None) == (self.concurrency is None):
            raise BenchError("give exactly one of a request rate or a concurrency")
        if self.concurrency is not None and self.concurrency < 1:
            raise BenchError(f"concurrency must be >= 1, got {self.concurrency}")
        if not (self.think_time_s >= 0 and math.isfinite(self.think_time_s)):
            raise BenchError(f"--think-time must be a finite number of seconds >= 0, got {self.think_time_s}")
        if not (self.ramp_up_s >= 0 and math.isfinite(self.ramp_up_s)):
            raise BenchError(f"--ramp-up must be a finite number of seconds >= 0, got {self.ramp_up_s}")
        if self.temperature is not None and not (0 <= self.temperature <= 2):
            raise BenchError(f"--temperature must be between 0 and 2, got {self.temperature}")
        self.url = self.url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def fetch_model(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    """The first model a server lists at ``/v1/models``."""
    base = url.rstrip("/").removesuffix("/v1")
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            r = await client.get(f"{base}/v1/models", headers=_headers(api_key))
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach {base}: {type(e).__name__}: {e}; is the server running?") from None
    if r.status_code != 200:
        raise BenchError(f"{base}/v1/models answered HTTP {r.status_code}; pass --model")
    data = r.json().get("data") or []
    if not data:
        raise BenchError(f"{base} lists no models; pass --model")
    return data[0]["id"]


def _body(spec: LoadSpec, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": spec.model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.endpoint == "chat":
        body["messages"] = messages
    else:
        body["prompt"] = "\n".join(m["content"] for m in messages)
    if spec.temperature is not None:
        body["temperature"] = spec.temperature
    if spec.ignore_eos:
        body["ignore_eos"] = True
    body.update(spec.extra_body)
    return body


def _delta_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "delta" in c:
        return (c["delta"] or {}).get("content") or ""
    return c.get("text") or ""


async def stream_one(
    client: httpx.AsyncClient, spec: LoadSpec, messages: list[dict[str, str]], max_tokens: int, t0: float
) -> tuple[RequestResult, str]:
    """Send one streamed request; return its measurements and the answer text."""
    path = "/v1/chat/completions" if spec.endpoint == "chat" else "/v1/completions"
    start = time.perf_counter()
    res = RequestResult(start_s=start - t0)
    parts: list[str] = []
    last = None
    num_chunks = 0
    sent = {"at": start}

    async def trace(event: str, info: dict) -> None:
        # latency counts from when the request hits the wire, not from waiting for a pooled connection
        if event.endswith("send_request_headers.started"):
            sent["at"] = time.perf_counter()

    try:
        async with client.stream(
            "POST",
            spec.url + path,
            json=_body(spec, messages, max_tokens),
            headers=_headers(spec.api_key),
            extensions={"trace": trace},
        ) as r:
            if r.status_code != 200:
                await r.aread()
                res.error = f"http_{r.status_code}"
                return res, ""
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    continue  # read to the end so the connection goes back to the pool
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = "stream_error"
                    return res, ""
                usage = chunk.get("usage")
                if usage:
                    res.num_input_tokens = int(usage.get("prompt_tokens") or 0)
                    res.num_output_tokens = int(usage.get("completion_tokens") or 0)
                    res.is_usage_reported = True
                text = _delta_text(chunk)
                if not text:
                    continue
                num_chunks += 1
                parts.append(text)
                if last is None:
                    start = sent["at"]
                    res.ttft_s = now - start
                else:
                    res.itls_s.append(now - last)
                last = now
    except httpx.TimeoutException:
        res.error = "timeout"
        return res, ""
    except httpx.HTTPError as e:
        res.error = type(e).__name__
        return res, ""
    except json.JSONDecodeError:
        res.error = "bad_json"
        return res, ""
    res.e2e_s = time.perf_counter() - start
    if last is None:
        res.error = "empty_answer"
        return res, ""
    if not res.is_usage_reported:
        res.num_output_tokens = num_chunks
    res.is_ok = True
    return res, "".join(parts)


async def _conversation(
    client: httpx.AsyncClient,
    spec: LoadSpec,
    req: BenchRequest,
    index: int,
    t0: float,
    emit: Callable[[RequestResult], None],
) -> None:
    messages = list(req.messages)
    turns = [(None, req.max_tokens)] + list(zip(req.followups, req.followup_max_tokens))
    for turn, (user, max_tokens) in enumerate(turns):
        if user is not None:
            messages = messages + [{"role": "user", "content": user}]
        res, text = await stream_one(client, spec, messages, max_tokens, t0)
        if req.followups:
            res.conversation, res.turn = index, turn
        emit(res)
        if not res.is_ok:
            return
        messages = messages + [{"role": "assistant", "content": text}]


async def run_load(
    requests: list[BenchRequest],
    spec: LoadSpec,
    on_result: Callable[[RequestResult], None] | None = None,
    client: httpx.AsyncClient | None = None,
) -> tuple[list[RequestResult], float]:
    """Run ``requests`` against ``spec``; return every result and the wall duration."""
    results: list[RequestResult] = []

    def emit(r: RequestResult) -> None:
        results.append(r)
        if on_result is not None:
            on_result(r)

    num_conn = spec.concurrency or spec.max_in_flight or max(16, len(requests))
    own = client is None
    if client is None:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(spec.timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=num_conn, max_keepalive_connections=num_conn),
        )
    t0 = time.perf_counter()
    try:
        if spec.concurrency is not None:
            queue: asyncio.Queue = asyncio.Queue()
            for i, req in enumerate(requests):
                queue.put_nowait((i, req))

            num_workers = min(spec.concurrency, len(requests))

            async def worker(k: int) -> None:
                if spec.ramp_up_s:
                    await asyncio.sleep(k * spec.ramp_up_s / num_workers)
                while not queue.empty():
                    i, req = queue.get_nowait()
                    await _conversation(client, spec, req, i, t0, emit)
                    if spec.think_time_s and not queue.empty():  # no pause after the last request
                        await asyncio.sleep(spec.think_time_s)

            await asyncio.gather(*(worker(k) for k in range(num_workers)))
        else:
            assert spec.arrival is not None
            offsets = spec.arrival.offsets(len(requests))
            sem = asyncio.Semaphore(spec.max_in_flight) if spec.max_in_flight else None

            async def send(i: int, req: BenchRequest) -> None:
                if sem is None:
                    await _conversation(client, spec, req, i, t0, emit)
                else:
                    async with sem:
                        await _conversation(client, spec, req, i, t0, emit)

            tasks = []
            for i, req in enumerate(requests):
                at = req.arrival_s if req.arrival_s is not None else float(offsets[i])
                delay = t0 + at - time.perf_counter()
                if delay > 0 and math.isfinite(delay):
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(send(i, req)))
            await asyncio.gather(*tasks)
    finally:
        if own:
            await client.aclose()
    return results, time.perf_counter() - t0
