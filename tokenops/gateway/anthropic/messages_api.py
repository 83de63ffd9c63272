"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API.

A request is translated to the gateway's one internal request (a chat-completions
body, :mod:`tokenops.gateway.anthropic.messages_schema`) and runs through the same pipeline as
``/v1/chat/completions``: keys and tenants, admission (rate limits, budgets), cache,
routing, fallback and telemetry (the record's ``decisions["api"]`` is ``messages``).
The original body rides along (``GatewayRequest.native``): an ``openai`` upstream
that serves ``/v1/messages`` gets it as sent; the bundled engine and chat-only
upstreams get the translation. Answers and errors are in Anthropic's shapes
(:mod:`tokenops.gateway.anthropic.messages_stream`); the API key may come as ``x-api-key``.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.gateway.anthropic.messages_schema import chat_body, check_fields, messages_error
from tokenops.gateway.anthropic.messages_stream import encode_stream, error_body, message_body
from tokenops.gateway.core.admission import for_messages
from tokenops.gateway.edge.abandon import unless_abandoned
from tokenops.gateway.edge.body import build_off_loop, checked_body
from tokenops.gateway.edge.event_stream import EventStream
from tokenops.gateway.errors import APIError
from tokenops.gateway.intake import caller, read_caller_body, stamp
from tokenops.gateway.openai.schemas import chat_request
from tokenops.gateway.openai.tokenize_api import count_message_tokens
from tokenops.types import GatewayRequest, NativeRequest

router = APIRouter()
log = logging.getLogger("tokenops.gateway")
_JSON = "application/json"


def anthropic_error(err: APIError) -> Response:
    """``err`` in Anthropic's shape, naming the Messages API's fields (``input_schema``, not the
    translation's ``tools[0].function.parameters``)."""
    err = messages_error(err)
    return Response(json.dumps(error_body(err)), status_code=err.status, media_type=_JSON, headers=err.headers)


def _upstream_only(gw: Any, model: Any) -> bool:
    """Every replica of ``model`` is an upstream that may serve /v1/messages (not known not to)."""
    replicas = gw.replicas.get(model) if isinstance(model, str) else None
    if not replicas:
        return False
    return all(
        getattr(r.backend, "kind", None) == "openai" and getattr(r.backend, "serves_messages", None) is not False
        for r in replicas
    )


def _is_reasoning(gw: Any, model: Any) -> bool | None:
    """Whether ``model`` thinks: known for bundled models (a ``reasoning_parser``), else None."""
    replicas = gw.replicas.get(model) if isinstance(model, str) else None
    if not replicas or any(getattr(r.backend, "kind", None) != "local" for r in replicas):
        return None
    return replicas[0].backend.reasoning_parser is not None


def is_bundled(gw: Any, model: Any) -> bool:
    """Every replica of ``model`` is a bundled (text-only) engine."""
    replicas = gw.replicas.get(model) if isinstance(model, str) else None
    return bool(replicas) and all(getattr(r.backend, "kind", None) == "local" for r in replicas or ())


def text_only_error(gw: Any, model: Any, untranslatable: Any) -> APIError | None:
    """The 400 of the first block a bundled (text-only) model cannot read, e.g. an ``image``."""
    if not untranslatable.text_only or not is_bundled(gw, model):
        return None
    param, message = untranslatable.text_only[0]
    return APIError(400, message, code="unsupported_content_type", param=param)


def messages_request(gw: Any, data: dict[str, Any], default_max_tokens: int) -> GatewayRequest:
    """The internal request of a Messages body; what the translation cannot carry is a 400
    now, unless the model's upstreams may take the body as sent. ``max_tokens: 0`` (cache
    pre-warming) runs the prompt into the prefix cache and generates nothing."""
    body, untranslatable = chat_body(data, is_reasoning_model=_is_reasoning(gw, data.get("model")))
    err = untranslatable.error() or text_only_error(gw, data.get("model"), untranslatable)
    if err is not None and not _upstream_only(gw, data.get("model")):
        raise err
    if untranslatable:  # the chat body does not hold the whole request: a cache keyed on it must not answer it
        body["cache"] = False
    asked = data.get("max_tokens")  # the Anthropic body's (its chat translation carries it as sent)
    is_prefill_only = asked == 0 and type(asked) is int
    if is_prefill_only:  # validated as 1 (chat's floor), run as 0
        body["max_tokens"] = 1
        body["cache"] = False  # a semantic-cache answer would warm nothing
    greq = chat_request(body, default_max_tokens, is_generating=not is_prefill_only)
    if is_prefill_only:
        greq.max_tokens = greq.body["max_tokens"] = 0
    greq.native = NativeRequest(api="messages", path="/messages", body=data, untranslatable=list(untranslatable))
    greq.decide("api", "messages")
    return greq


async def _answer(request: Request, handler: Callable[[Request], Awaitable[Response]]) -> Response:
    """``handler``'s response, or its error in Anthropic's shape (a 500 keeps its traceback in the log)."""
    try:
        return await handler(request)
    except APIError as e:
        return anthropic_error(for_messages(e))  # a full queue: 529 overloaded_error
    except Exception as e:
        error_id = secrets.token_hex(6)
        log.error("internal error %s on %s", error_id, request.url.path, exc_info=e)
        return anthropic_error(
            APIError(
                500,
                f"The server had an error while processing your request (error id "
                f"{error_id}); retry, and report the id if it persists.",
            )
        )


@router.post("/v1/messages", tags=["anthropic"], summary="Create a Message (Anthropic's API; SSE when stream is true)")
async def create_message(request: Request) -> Response:
    return await _answer(request, _create)


async def _create(request: Request) -> Response:
    who = caller(request)
    gw, conf = who.gateway, who.gateway.settings.gateway
    raw = await read_caller_body(request, who)
    greq = await build_off_loop(
        raw, lambda b: messages_request(gw, checked_body(b, conf, "blocks"), conf.default_max_tokens)
    )
    stamp(greq, who)
    if greq.stream:
        deltas, rec = await unless_abandoned(request.receive, gw.pipeline.open_stream(greq))
        body = encode_stream(
            greq, deltas, rec, rec.model_served or greq.model, with_decisions=gw.pipeline.decision_headers
        )
        return EventStream(
            body,
            deltas,
            media_type="text/event-stream",
            headers={
                "cache-control": "no-cache",
                "x-accel-buffering": "no",
                "request-id": greq.id,
                **greq.response_headers,
            },
        )
    response, rec = await unless_abandoned(request.receive, gw.pipeline.respond(greq))  # a client that leaves cancels
    answer = message_body(greq, response, rec.model_served or greq.model)
    return Response(
        json.dumps(answer, ensure_ascii=False),
        media_type=_JSON,
        headers={"request-id": greq.id, **greq.response_headers},
    )


@router.post("/v1/messages/count_tokens", tags=["anthropic"], summary="Count a Message's input tokens")
async def count_tokens(request: Request) -> Response:
    return await _answer(request, _count)


async def _count(request: Request) -> Response:
    who = caller(request)
    gw, raw = who.gateway, await read_caller_body(request, who)
    data = await build_off_loop(raw, lambda b: checked_body(b, gw.settings.gateway, "blocks"))
    check_fields(data, is_count=True)
    count = await count_message_tokens(gw, data, dict(request.headers))
    return Response(json.dumps({"input_tokens": count}), media_type=_JSON)


_OTHER_METHODS = ["GET", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE"]


@router.api_route("/v1/messages", methods=_OTHER_METHODS, include_in_schema=False)
async def wrong_method(request: Request) -> Response:
    return anthropic_error(
        APIError(405, f"Method {request.method} is not allowed on /v1/messages: use POST.", headers={"Allow": "POST"})
    )


@router.api_route("/v1/messages/{rest:path}", methods=[*_OTHER_METHODS, "POST"], include_in_schema=False)
async def unknown_path(request: Request, rest: str) -> Response:
    # e.g. the Message Batches API, which this server does not implement
    if rest == "count_tokens":  # the path exists: another method is a 405, as the OpenAPI document says
        return anthropic_error(
            APIError(
                405,
                f"Method {request.method} is not allowed on {request.url.path}: use POST.",
                headers={"Allow": "POST"},
            )
        )
    return anthropic_error(APIError(404, f"Unknown path {request.url.path}"))
