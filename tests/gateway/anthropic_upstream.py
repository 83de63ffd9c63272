"""A small real upstream serving Anthropic's ``/v1/messages`` (as vLLM, SGLang, llama.cpp's
server, Ollama and LiteLLM do) for the gateway's pass-through tests, plus vLLM's
``/tokenize`` and ``/detokenize``. An HTTP server on a free loopback port, in a thread.

It serves ``MODEL_ID`` only (404 naming the model otherwise). Every answer has a thinking
block with a signature (something the gateway's own encoder never writes, so a test can
tell pass-through from translation), a text block and, when the request has ``tools``,
a ``tool_use`` block whose input streams in pieces. Bodies and headers are kept.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

MODEL_ID = "upstream-org/Claude-Compatible-7B"
THINKING, SIGNATURE, TEXT = "Let me look.", "sig-upstream-123", "Paris is sunny."
TOOL_ID, TOOL_PIECES = "toolu_upstream_1", ['{"ci', 'ty": "Pa', 'ris"}']
USAGE = {"input_tokens": 21, "output_tokens": 9, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 0}


def _events(model: str, with_tool: bool) -> list[dict[str, Any]]:
    start = {"id": "msg_upstream_1", "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": {**USAGE, "output_tokens": 1}}
    out: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"},
                                 {"type": "content_block_start", "index": 0,
                                  "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
                                 {"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "thinking_delta", "thinking": THINKING}},
                                 {"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "signature_delta", "signature": SIGNATURE}},
                                 {"type": "content_block_stop", "index": 0},
                                 {"type": "content_block_start", "index": 1,
                                  "content_block": {"type": "text", "text": ""}}]
    out += [{"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": w}}
            for w in ("Paris ", "is ", "sunny.")]
    out.append({"type": "content_block_stop", "index": 1})
    if with_tool:
        out.append({"type": "content_block_start", "index": 2, "content_block": {
            "type": "tool_use", "id": TOOL_ID, "name": "get_weather", "input": {}}})
        out += [{"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": p}}
                for p in TOOL_PIECES]
        out.append({"type": "content_block_stop", "index": 2})
    out.append({"type": "message_delta", "delta": {"stop_reason": "tool_use" if with_tool else "end_turn",
                                                   "stop_sequence": None}, "usage": {"output_tokens": 9}})
    out.append({"type": "message_stop"})
    return out


def _message(model: str, with_tool: bool) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "thinking", "thinking": THINKING, "signature": SIGNATURE},
                                     {"type": "text", "text": TEXT}]
    if with_tool:
        content.append({"type": "tool_use", "id": TOOL_ID, "name": "get_weather", "input": {"city": "Paris"}})
    return {"id": "msg_upstream_1", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": "tool_use" if with_tool else "end_turn", "stop_sequence": None, "usage": USAGE}


def build_app(seen: list[tuple[str, dict[str, Any], dict[str, str]]]):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL_ID, "object": "model", "max_model_len": 4096}]})

    async def read(request: Request) -> tuple[dict[str, Any], JSONResponse | None]:
        body = await request.json()
        seen.append((request.url.path, body, dict(request.headers)))
        if body.get("model") != MODEL_ID:
            return body, JSONResponse({"type": "error", "error": {
                "type": "not_found_error", "message": f"model: {body.get('model')}"}}, status_code=404)
        return body, None

    async def messages(request: Request):
        body, error = await read(request)
        if error is not None:
            return error
        with_tool = bool(body.get("tools"))
        if not body.get("stream"):
            return JSONResponse(_message(MODEL_ID, with_tool))

        def stream():
            for ev in _events(MODEL_ID, with_tool):
                yield f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()
        return StreamingResponse(stream(), media_type="text/event-stream")

    async def count_tokens(request: Request) -> JSONResponse:
        _, error = await read(request)
        return error or JSONResponse({"input_tokens": 42})

    async def tokenize(request: Request) -> JSONResponse:
        _, error = await read(request)
        return error or JSONResponse({"count": 3, "max_model_len": 4096, "tokens": [7, 8, 9], "token_strs": None})

    async def detokenize(request: Request) -> JSONResponse:
        _, error = await read(request)
        return error or JSONResponse({"prompt": "seven eight nine"})

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/messages", messages, methods=["POST"]),
                             Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
                             Route("/tokenize", tokenize, methods=["POST"]),
                             Route("/detokenize", detokenize, methods=["POST"])])


class AnthropicUpstream:
    """``with AnthropicUpstream() as up: up.url, up.seen`` ((path, body, headers) per request)."""

    def __init__(self) -> None:
        import uvicorn

        from tokenops.testing_serve import free_port

        self.port = free_port()
        self.seen: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.server = uvicorn.Server(uvicorn.Config(build_app(self.seen), host="127.0.0.1", port=self.port,
                                                    log_level="error", access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "AnthropicUpstream":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the test upstream did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
