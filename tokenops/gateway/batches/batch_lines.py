"""One batch line as the route of its ``url`` would take it: the request is built by the same
function the route uses (so a line is validated, defaulted and bounded exactly like a request)
and run through the same pipeline (admission plugins, routing, budgets, telemetry), marked
``priority_class = "batch"``. Upload validation (:mod:`.batch_input`) builds every line this
way once; the runner builds it again when it runs it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenops.gateway.edge.body import checked_body
from tokenops.gateway.errors import APIError
from tokenops.gateway.openai.embeddings import embed, embedding_request
from tokenops.gateway.openai.openai_format import response_body
from tokenops.gateway.openai.schemas import chat_request, completion_request
from tokenops.gateway.responses.responses_api import _build as responses_request
from tokenops.gateway.responses.responses_chat import deferred_error
from tokenops.gateway.responses.responses_output import ResponseFrame
from tokenops.types import GatewayRequest

CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)


@dataclass(slots=True)
class LineCall:
    """A line's request, ready for the pipeline; ``frame`` is the Responses API's translation."""

    url: str
    request: GatewayRequest
    frame: Any = None


def build_call(gw: Any, url: str, body: dict[str, Any]) -> LineCall:
    """The request of one line's ``body`` for ``url``, or the 400 the route would answer."""
    conf = gw.settings.gateway
    if body.get("stream") is not None and body.get("stream") is not False:
        raise APIError(400, "body.stream: a batch line cannot stream; leave stream out", param="body.stream")
    data = checked_body(json.dumps(body, ensure_ascii=False).encode("utf-8"), conf)
    if url == CHAT:
        return LineCall(url, chat_request(data, conf.default_max_tokens))
    if url == COMPLETIONS:
        return LineCall(url, completion_request(data, conf.default_max_tokens))
    if url == EMBEDDINGS:
        return LineCall(url, embedding_request(data))
    if url == RESPONSES:
        if data.get("previous_response_id") is not None:
            raise APIError(
                400,
                "body.previous_response_id: a batch line carries its whole input",
                param="body.previous_response_id",
            )
        req, request, _, tr = responses_request(gw, {**data, "store": False}, [], conf.default_max_tokens)
        return LineCall(url, request, (req, tr))
    raise APIError(400, f"url: {url!r} is not one of {', '.join(ENDPOINTS)}", param="url")


async def run_call(gw: Any, call: LineCall) -> dict[str, Any]:
    """The response body the route would send for the line (raises its APIError)."""
    request = call.request
    if call.url == EMBEDDINGS:
        return await embed(gw, request)
    if call.url == RESPONSES:
        req, tr = call.frame
        try:
            answer, rec = await gw.pipeline.respond(request)
        except APIError as e:
            raise deferred_error(e, tr) from None
        return ResponseFrame(req, rec.model_served or req.model).finished(answer)
    response, rec = await gw.pipeline.respond(request)
    return json.loads(response_body(request, response, rec.model_served or request.model))


def num_tokens(body: dict[str, Any]) -> int:
    """Prompt and generated tokens of a response body (its ``usage``)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
    return sum(v for k in parts if isinstance(v := usage.get(k), int))


def num_generated(body: dict[str, Any]) -> int:
    """Generated tokens of a response body (its ``usage``; 0 for embeddings)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0
    return sum(v for k in ("completion_tokens", "output_tokens") if isinstance(v := usage.get(k), int))
