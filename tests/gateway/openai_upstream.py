"""A small real OpenAI-compatible upstream for gateway tests (an HTTP server on a free
loopback port, in a thread), standing in for vLLM / SGLang / llama.cpp server.

It serves one model under its own id (``MODEL_ID``, unlike the gateway's name) and
answers 404 for any other id, as vLLM does. Chat requests with ``tools`` get two
parallel tool calls whose arguments stream in several pieces; a message containing
"refuse" gets a refusal, one containing "think" a ``reasoning_content`` (as vLLM's
reasoning parsers send it); otherwise an echo of the last message. ``/v1/completions``
honours ``echo`` and ``suffix``; ``/v1/embeddings`` answers float or base64 vectors. Every request body is kept in ``bodies``.

With ``responses=True`` it serves ``/v1/responses`` too (as vLLM does): a request with
``tools`` gets a ``function_call`` of the first tool, one whose last input says "think" a
``reasoning`` item, else an echo; streamed as OpenAI's typed events. Without, that path is a 404.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from typing import Any, Self

MODEL_ID = "upstream-org/Real-Model-7B-Instruct"
#: The tool calls every request with ``tools`` gets: (id, name, argument pieces).
TOOL_CALLS = [
    ("call_upstream_0a1b", "get_weather", ['{"ci', 'ty": "Par', 'is", "unit"', ': "celsius"}']),
    ("call_upstream_2c3d", "get_time", ["{", '"tz": "Europe/', 'Paris"', "}"]),
]
EMBED_DIM = 8


def _vector(text: str) -> list[float]:
    return [float((len(text) * (i + 1)) % 7) / 7.0 for i in range(EMBED_DIM)]


def _responses_route(bodies: list[dict[str, Any]]):
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse

    async def responses(request: Request):
        body = await request.json()
        bodies.append(body)
        if body.get("model") != MODEL_ID:
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                           "type": "invalid_request_error", "param": None, "code": "model_not_found"}},
                                status_code=404)
        items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        last = items[-1].get("content") or items[-1].get("output") or ""
        last = last if isinstance(last, str) else "".join(p.get("text", "") for p in last)
        output: list[dict[str, Any]] = []
        if "think" in last:
            output.append({"id": "rs_up", "type": "reasoning", "summary": [],
                           "content": [{"type": "reasoning_text", "text": "6 times 7 is 42."}]})
        if body.get("tools"):
            output.append({"id": "fc_up", "type": "function_call", "call_id": "call_up_1", "status": "completed",
                           "name": body["tools"][0].get("name", body["tools"][0]["type"]), "arguments": '{"city": "Paris"}'})
        else:
            output.append({"id": "msg_up", "type": "message", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": "upstream: " + last, "annotations": []}]})
        usage = {"input_tokens": 13, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                 "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 3 if "think" in last else 0},
                 "total_tokens": 20}
        done = {"id": "resp_upstream", "object": "response", "created_at": int(time.time()), "model": MODEL_ID,
                "status": "completed", "output": output, "usage": usage, "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": body.get("tools") or []}
        if not body.get("stream"):
            return JSONResponse(done)

        def events():
            seq = 0

            def event(kind: str, **fields: Any) -> bytes:
                nonlocal seq
                seq += 1
                return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq - 1, **fields})}\n\n".encode()

            yield event("response.created", response={**done, "status": "in_progress", "output": []})
            for i, item in enumerate(output):
                if item["type"] == "function_call":
                    yield event("response.output_item.added", output_index=i, item={**item, "arguments": ""})
                    for piece in ('{"city"', ': "Paris"}'):
                        yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                                    delta=piece)
                elif item["type"] == "reasoning":
                    yield event("response.output_item.added", output_index=i, item={**item, "content": []})
                    yield event("response.reasoning_text.delta", item_id=item["id"], output_index=i, content_index=0,
                                delta=item["content"][0]["text"])
                else:
                    yield event("response.output_item.added", output_index=i, item={**item, "content": []})
                    for word in item["content"][0]["text"].split(" "):
                        yield event("response.output_text.delta", item_id=item["id"], output_index=i,
                                    content_index=0, delta=word + " ", logprobs=[])
                yield event("response.output_item.done", output_index=i, item=item)
            yield event("response.completed", response=done)

        return StreamingResponse(events(), media_type="text/event-stream")

    return responses


def build_app(bodies: list[dict[str, Any]], responses: bool = False, headers: list[dict[str, str]] | None = None):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(status: int, message: str, code: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                       "code": code}}, status_code=status)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 1,
                                                         "owned_by": "upstream", "max_model_len": 4096}]})

    async def chat(request: Request):
        body = await request.json()
        bodies.append(body)
        if headers is not None:
            headers.append(dict(request.headers))
        if body.get("model") != MODEL_ID:
            return error(404, f"The model `{body.get('model')}` does not exist.", "model_not_found")
        created = int(time.time())
        last = str(body["messages"][-1].get("content") or "")
        usage = {"prompt_tokens": 11, "completion_tokens": 17, "total_tokens": 28}
        head = {"id": "chatcmpl-upstream", "created": created, "model": MODEL_ID, "system_fingerprint": "fp_up"}
        if body.get("tools"):
            calls = [{"id": cid, "type": "function", "function": {"name": name, "arguments": "".join(pieces)}}
                     for cid, name, pieces in TOOL_CALLS]
            message = {"role": "assistant", "content": None, "tool_calls": calls, "refusal": None}
            finish = "tool_calls"
        elif "think" in last:  # a reasoning model as vLLM serves it (--reasoning-parser)
            message = {"role": "assistant", "content": "42", "reasoning_content": "6 times 7 is 42.", "refusal": None}
            finish = "stop"
            usage = {**usage, "completion_tokens_details": {"reasoning_tokens": 6}}
        elif "refuse" in last:
            message = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
            finish = "stop"
        else:
            message = {"role": "assistant", "content": "echo: " + last, "refusal": None}
            finish = "stop"
        if not body.get("stream"):
            return JSONResponse({**head, "object": "chat.completion", "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}], "usage": usage})

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
            doc = {**head, "object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}], **extra}
            return b"data: " + json.dumps(doc).encode() + b"\n\n"

        def events():
            yield chunk({"role": "assistant", "content": ""})
            if message.get("tool_calls"):
                for k, (cid, name, pieces) in enumerate(TOOL_CALLS):
                    yield chunk({"tool_calls": [{"index": k, "id": cid, "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]})
                    for piece in pieces:
                        yield chunk({"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
            elif message.get("reasoning_content"):
                for piece in ("6 times ", "7 is 42."):
                    yield chunk({"reasoning_content": piece})
                yield chunk({"content": message["content"]})
            elif message.get("refusal"):
                for piece in ("I can't ", "help with ", "that."):
                    yield chunk({"refusal": piece})
            else:
                for word in message["content"].split(" "):
                    yield chunk({"content": word + " "})
            yield chunk({}, finish)
            if (body.get("stream_options") or {}).get("include_usage"):
                doc = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
                yield b"data: " + json.dumps(doc).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        bodies.append(body)
        if body.get("model") != MODEL_ID:
            return error(404, f"The model `{body.get('model')}` does not exist.", "model_not_found")
        text = (body["prompt"] if body.get("echo") else "") + " and so on" + (body.get("suffix") or "")
        return JSONResponse({"id": "cmpl-upstream", "object": "text_completion", "created": int(time.time()),
                             "model": MODEL_ID, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                             "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})

    async def embeddings(request: Request) -> JSONResponse:
        body = await request.json()
        bodies.append(body)
        if body.get("model") != MODEL_ID:
            return error(404, f"The model `{body.get('model')}` does not exist.", "model_not_found")
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = []
        for i, text in enumerate(inputs):
            vec = _vector(str(text))
            if body.get("encoding_format") == "base64":
                emb: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            else:
                emb = vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        n = sum(len(str(t).split()) for t in inputs)
        return JSONResponse({"object": "list", "data": data, "model": MODEL_ID,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    routes = [Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/embeddings", embeddings, methods=["POST"])]
    if responses:
        routes.append(Route("/v1/responses", _responses_route(bodies), methods=["POST"]))
    return Starlette(routes=routes)


class Upstream:
    """The upstream running in a thread: ``with Upstream() as up: up.url, up.bodies``. A subclass may
    serve another app (``make_app``), e.g. :func:`holding` around :func:`build_app`'s."""

    def __init__(self, port: int | None = None, responses: bool = False) -> None:
        import socket

        import uvicorn

        if port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        self.port = port
        self.responses = responses
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each chat request's headers (a forwarded traceparent)
        self.server = uvicorn.Server(uvicorn.Config(self.make_app(), host="127.0.0.1", port=self.port,
                                                    log_level="error", access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def make_app(self) -> Any:
        return build_app(self.bodies, self.responses, self.headers)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the test upstream did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def holding(inner: Any, hold: Any) -> Any:
    """``inner`` (an ASGI app) with each POST held first: its body is read whole and ``hold(body)``
    (an async context manager) entered; ``inner`` answers inside it, from the body read."""

    async def app(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await inner(scope, receive, send)
        raw, more = b"", True
        while more:
            message = await receive()
            raw += message.get("body", b"")
            more = message.get("more_body", False)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        async with hold(raw):
            await inner(scope, replay, send)

    return app
