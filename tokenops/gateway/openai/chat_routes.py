"""``POST /v1/chat/completions``, ``POST /v1/completions`` and ``GET /v1/models``: OpenAI's core routes.

Each request enters through :mod:`tokenops.gateway.intake`, is built into the gateway's one internal
request off the event loop (:mod:`tokenops.gateway.openai.schemas`) and runs through the pipeline,
answered whole or as OpenAI's SSE chunks; a ``prompt`` list fans out one request per prompt.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.gateway.core.decision_headers import decision_values
from tokenops.gateway.edge.abandon import unless_abandoned
from tokenops.gateway.edge.body import build_off_loop, checked_body
from tokenops.gateway.edge.event_stream import EventStream
from tokenops.gateway.errors import APIError, sse_error
from tokenops.gateway.intake import caller, read_caller_body, stamp
from tokenops.gateway.openai.model_routes import model_cards
from tokenops.gateway.openai.openai_format import DONE, ChunkWriter, response_body
from tokenops.gateway.openai.prompt_fan_out import PromptFanOut
from tokenops.gateway.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_request,
    completion_requests,
    openapi_body,
)
from tokenops.types import GatewayRequest

_JSON = "application/json"

router = APIRouter()


@router.post(
    "/v1/chat/completions",
    tags=["openai"],
    openapi_extra=openapi_body(ChatCompletionRequest),
    summary="Create a chat completion (SSE when stream is true)",
)
async def chat_completions(request: Request) -> Response:
    return await _handle(request, chat_request)


@router.post(
    "/v1/completions",
    tags=["openai"],
    openapi_extra=openapi_body(CompletionRequest),
    summary="Create a text completion (SSE when stream is true)",
)
async def completions(request: Request) -> Response:
    limit = request.app.state.gateway.settings.gateway.max_messages  # prompts of one body
    return await _handle(request, lambda data, default: completion_requests(data, default, limit))


@router.get("/v1/models", tags=["openai"], summary="Models this server serves")
async def list_models(request: Request) -> Response:
    gw = caller(request, is_write=False).gateway
    return Response(json.dumps({"object": "list", "data": list(model_cards(gw))}), media_type=_JSON)


async def _handle(request: Request, build: Any) -> Response:
    who = caller(request)
    gw = who.gateway
    conf = gw.settings.gateway
    raw = await read_caller_body(request, who)
    # large bodies are parsed and validated in a worker thread (the event loop keeps serving)
    built = await build_off_loop(raw, lambda b: build(checked_body(b, conf), conf.default_max_tokens))
    greqs: list[GatewayRequest] = built if isinstance(built, list) else [built]  # a list: completions' prompts
    for one in greqs:
        stamp(one, who)
    greq = greqs[0]
    runner = gw.pipeline if len(greqs) == 1 else PromptFanOut(gw.pipeline, greqs)
    if greq.stream:
        return await _stream(gw, greq, request.receive, runner)
    # a client that leaves cancels its request (the engine aborts it): tokenops/gateway/edge/abandon.py
    response, rec = await unless_abandoned(request.receive, runner.respond(greq))
    return Response(
        response_body(greq, response, rec.model_served or greq.model),
        media_type=_JSON,
        headers=greq.response_headers or None,
    )


async def _stream(gw: Any, greq: GatewayRequest, receive: Any, runner: Any) -> Response:
    # up to the first delta (a wait for a slot, the prefill) nothing is written: watched like a whole answer
    deltas, rec = await unless_abandoned(receive, runner.open_stream(greq))
    writer = ChunkWriter(greq, rec.model_served or greq.model)

    async def body() -> AsyncIterator[bytes]:
        started: set[int] = set()
        usage = None
        # without a usage chunk, the last finish chunk carries the decisions: it is held until the end
        hold = gw.pipeline.decision_headers and not writer.include_usage
        held: tuple[int, str] | None = None
        async with contextlib.aclosing(deltas):
            try:
                async for d in deltas:
                    if held is not None and not d.is_usage:
                        yield writer.finish(*held)
                        held = None
                    if d.is_usage:
                        usage = d
                        continue
                    if writer.is_chat and d.index not in started:
                        started.add(d.index)
                        yield writer.role(d.index)
                    if d.extra and writer.is_chat:  # e.g. reasoning_content: before the content, as sent
                        yield writer.other(d.index, d.extra)
                    if d.text or d.logprobs:
                        yield writer.content(d.index, d.text, d.logprobs)
                    if d.refusal and writer.is_chat:
                        yield writer.refusal(d.index, d.refusal)
                    if d.tool_calls and writer.is_chat:
                        yield writer.tool_calls(d.index, d.tool_calls)
                    if d.finish_reason and hold:
                        held = (d.index, d.finish_reason)
                    elif d.finish_reason:
                        yield writer.finish(d.index, d.finish_reason)
            except APIError as e:
                if held is not None:
                    yield writer.finish(*held)
                yield sse_error(e)
                yield DONE
                return
        final = decision_values(rec) if gw.pipeline.decision_headers else None
        if writer.include_usage:
            prompt = usage.prompt_tokens if usage else rec.tokens_in
            completion = usage.completion_tokens if usage and usage.completion_tokens is not None else rec.tokens_out
            yield writer.usage(
                prompt or 0,
                completion or 0,
                (usage.cached_tokens if usage else rec.tokens_cached) or 0,
                usage.reasoning_tokens if usage else rec.reasoning_tokens,
                final,
            )
        elif held is not None:
            yield writer.finish(*held, final)
        yield DONE

    return EventStream(
        body(),
        deltas,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **greq.response_headers},
    )
