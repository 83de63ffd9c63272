"""A small OpenAI-compatible SSE server for bench/tune tests.

It simulates a continuous-batching engine in real time: each step decodes one
token for every running sequence and spends what is left of the token budget
on prefill; a step costs ``base_s + per_token_s * batch_tokens``. Sequences
beyond ``max_num_seqs`` wait. So latency has a real knee as load grows, and the
live tunables (engine.max_num_seqs, engine.max_num_batched_tokens) trade TTFT
against TPOT as they do in a real engine. The admin API follows the contract
(GET/PATCH /admin/tunables, 400 for restart-only tunables).

For checking load generators against each other, :class:`FixedLatencyEngine`
gives every request the same TTFT and ITL on its own timer, with no shared step
clock at all, so a client should measure exactly those delays plus its own
overhead. ``GET /fake/requests`` lists what the server saw of each request
(wall-clock arrival, first and last token sent, the client's address); ``POST
/fake/requests/reset`` clears that list.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenops.plugin_manager import get_tunables
from tokenops.tunables import TunableError


@dataclass
class _Seq:
    num_prompt: int
    max_tokens: int
    out: asyncio.Queue
    num_prefilled: int = 0
    num_generated: int = 0


@dataclass
class FakeEngine:
    base_s: float = 0.004
    per_token_s: float = 0.0001
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    #: Extra cost of every step while prefix caching is on (lets a test make a non-default winner).
    prefix_caching_cost_s: float = 0.0
    waiting: list = field(default_factory=list)
    running: list = field(default_factory=list)
    num_steps: int = 0
    wake: asyncio.Event | None = None

    async def loop(self) -> None:
        self.wake = asyncio.Event()
        while True:
            if not self.waiting and not self.running:
                self.wake.clear()
                await self.wake.wait()
            budget = self.max_num_batched_tokens
            decodes = [s for s in self.running if s.num_prefilled >= s.num_prompt]
            budget -= len(decodes)
            while self.waiting and len(self.running) < self.max_num_seqs:
                self.running.append(self.waiting.pop(0))
            prefills = []
            for s in self.running:
                if s.num_prefilled < s.num_prompt and budget > 0:
                    n = min(budget, s.num_prompt - s.num_prefilled)
                    prefills.append((s, n))
                    budget -= n
            num_tokens = len(decodes) + sum(n for _, n in prefills)
            extra = self.prefix_caching_cost_s if self.enable_prefix_caching else 0.0
            await asyncio.sleep(self.base_s + self.per_token_s * num_tokens + extra)
            self.num_steps += 1
            for s, n in prefills:
                s.num_prefilled += n
                if s.num_prefilled >= s.num_prompt:
                    decodes.append(s)  # the last prefill chunk samples the first token
            for s in decodes:
                s.num_generated += 1
                s.out.put_nowait(s.num_generated)
            self.running = [s for s in self.running if s.num_generated < s.max_tokens]

    def submit(self, num_prompt: int, max_tokens: int) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.waiting.append(_Seq(max(1, num_prompt), max_tokens, q))
        assert self.wake is not None
        self.wake.set()
        return q


@dataclass
class FixedLatencyEngine:
    """Every request on its own timer: the first token ``ttft_s`` after arrival, then one per ``itl_s``.

    No batching and no shared step clock, so when a client sends a request (and
    how many others are in flight) does not change its latency.
    """

    ttft_s: float = 0.02
    itl_s: float = 0.01
    max_num_seqs: int = 1 << 20
    max_num_batched_tokens: int = 1 << 20
    enable_prefix_caching: bool = True
    num_steps: int = 0

    def __post_init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    async def loop(self) -> None:
        await asyncio.Event().wait()  # nothing shared to run

    async def _run(self, q: asyncio.Queue, max_tokens: int) -> None:
        await asyncio.sleep(self.ttft_s)
        for i in range(max_tokens):
            if i:
                await asyncio.sleep(self.itl_s)
            q.put_nowait(i + 1)

    def submit(self, num_prompt: int, max_tokens: int) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        task = asyncio.get_running_loop().create_task(self._run(q, max_tokens))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return q


def create_fake_app(engine: FakeEngine, admin_key: str = "test-admin", send_usage: bool = True) -> FastAPI:
    app = FastAPI()
    registry = get_tunables()
    seen: list[dict] = []

    @app.on_event("startup")
    async def _start() -> None:
        app.state.task = asyncio.create_task(engine.loop())

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    def _peer(request: Request) -> str:
        return f"{request.client.host}:{request.client.port}" if request.client else "?"

    @app.get("/fake/requests")
    async def fake_requests():
        return {"requests": seen}

    @app.post("/fake/requests/reset")
    async def fake_requests_reset():
        seen.clear()
        return {"ok": True}

    async def _stream(body: dict, chat: bool, arrived: float, peer: str):
        if chat:
            parts = []
            for m in body["messages"]:
                c = m["content"]
                parts += [p.get("text", "") for p in c] if isinstance(c, list) else [c]
            text = " ".join(parts)
        else:
            text = body["prompt"] if isinstance(body["prompt"], str) else " ".join(body["prompt"])
        num_prompt = len(text.split())
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        q = engine.submit(num_prompt, max_tokens)
        rec = {"arrived": arrived, "first_token": None, "last_token": None, "num_prompt": num_prompt,
               "max_tokens": max_tokens, "peer": peer}
        seen.append(rec)
        include_usage = (body.get("stream_options") or {}).get("include_usage") and send_usage
        for i in range(max_tokens):
            await q.get()
            rec["last_token"] = time.time()
            if i == 0:
                rec["first_token"] = rec["last_token"]
            word = f" w{i}"
            if chat:
                chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": word}}]}
            else:
                chunk = {"object": "text_completion", "choices": [{"index": 0, "text": word}]}
            yield f"data: {json.dumps(chunk)}\n\n"
        if include_usage:
            usage = {"prompt_tokens": num_prompt, "completion_tokens": max_tokens,
                     "total_tokens": num_prompt + max_tokens}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        arrived = time.time()
        return StreamingResponse(_stream(await request.json(), True, arrived, _peer(request)),
                                 media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        arrived = time.time()
        return StreamingResponse(_stream(await request.json(), False, arrived, _peer(request)),
                                 media_type="text/event-stream")

    def _auth(request: Request) -> JSONResponse | None:
        key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if key != admin_key and request.headers.get("x-admin-key") != admin_key:
            return JSONResponse({"error": {"message": "admin key required", "type": "auth", "param": None,
                                           "code": "unauthorized"}}, status_code=401)
        return None

    def _current() -> list[dict]:
        values = {"engine.max_num_seqs": engine.max_num_seqs,
                  "engine.max_num_batched_tokens": engine.max_num_batched_tokens,
                  "engine.enable_prefix_caching": engine.enable_prefix_caching}
        return [{**t.to_dict(), "value": values.get(t.name, t.default)} for t in registry]

    @app.get("/admin/tunables")
    async def get_tun(request: Request):
        return _auth(request) or {"tunables": _current()}

    @app.patch("/admin/tunables")
    async def patch_tun(request: Request):
        if (err := _auth(request)) is not None:
            return err
        values = (await request.json()).get("values", {})
        try:
            checked = registry.validate(values)
            for name in checked:
                if not registry[name].live:
                    raise TunableError(f"{name} needs a restart")
        except TunableError as e:
            return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error", "param": None,
                                           "code": None}}, status_code=400)
        for name, value in checked.items():
            attr = name.removeprefix("engine.")
            if hasattr(engine, attr):
                setattr(engine, attr, value)
        return {"applied": checked, "tunables": _current()}

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    """Runs the fake app with uvicorn on a loopback port in a background thread."""

    def __init__(self, engine: FakeEngine | None = None, **app_kwargs) -> None:
        self.engine = engine or FakeEngine()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_fake_app(self.engine, **app_kwargs), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            assert time.time() < deadline, "fake server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
