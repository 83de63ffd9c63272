"""Anthropic Messages bodies and event streams from the gateway's answers.

A translated answer (bundled engine, chat-only upstreams, cache replays) is encoded
here: ``thinking`` from ``reasoning_content``, ``text``, then ``tool_use`` blocks.
An upstream that serves ``/v1/messages`` itself sends its own events and bodies
(``Delta.extra["anthropic_event"]``, ``GatewayResponse.extra["anthropic_message"]``);
they are forwarded as they came, with the gateway's model name in.

Stream order, as Anthropic sends it: ``message_start``, ``ping``, per block
``content_block_start`` / ``content_block_delta``... / ``content_block_stop``, then
``message_delta`` (stop reason and usage) and ``message_stop``; an error after the
status line is an ``error`` event. With ``[gateway] decision_headers`` on, ``message_delta``
also carries the gateway's decisions (``"tokenops": {model, replica, cache, route, cost_usd}``,
as a chat stream's last chunk does): the cost is known only once the stream has ended, so an
upstream's own ``message_delta`` is held back until then. The SDKs keep the unknown key
(``event.model_extra["tokenops"]`` in the anthropic SDK).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from tokenops.backends.base import Delta
from tokenops.gateway.core.decision_headers import decision_values
from tokenops.gateway.errors import APIError
from tokenops.types import GatewayRequest, GatewayResponse

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
    "function_call": "tool_use",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def message_id(request: GatewayRequest) -> str:
    return "msg_" + request.id.split("-", 1)[-1]


def error_body(err: APIError) -> dict[str, Any]:
    """Anthropic's error shape for an OpenAI-style :class:`APIError`."""
    kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + _dumps(data).encode() + b"\n\n"


def stop_reason(request: GatewayRequest, finish_reason: str | None, has_calls: bool) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a chat finish reason."""
    matched = request.decisions.get("stop_sequence")
    if finish_reason == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    if has_calls and finish_reason in ("stop", None):
        return "tool_use", None
    return STOP_REASONS.get(finish_reason or "stop", "end_turn"), None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    # Anthropic counts cache reads apart from input_tokens (the total is their sum)
    return {
        "input_tokens": max(0, prompt_tokens - cached_tokens),
        "output_tokens": completion_tokens,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        value = None
    # a call the model wrote with invalid JSON (free, not constrained) keeps its text for the client to see
    return value if isinstance(value, dict) else {"_arguments": arguments}


def shows_thinking(request: GatewayRequest) -> bool:
    """False when the client asked for ``thinking.display: "omitted"``."""
    thinking = request.native.body.get("thinking") if request.native is not None else None
    return not (isinstance(thinking, dict) and thinking.get("display") == "omitted")


def message_body(request: GatewayRequest, response: GatewayResponse, model: str) -> dict[str, Any]:
    """The non-streamed Message."""
    native = response.extra.get("anthropic_message")
    if isinstance(native, dict):
        return {**native, "model": model}
    choice = (response.extra.get("choices") or [{}])[0]
    thinking = (choice.get("message_extra") or {}).get("reasoning_content") if shows_thinking(request) else None
    content: list[dict[str, Any]] = []
    if thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    text = response.text or response.refusal or ""
    if text:
        content.append({"type": "text", "text": text})
    for call in response.tool_calls or []:
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "",
                "name": fn.get("name") or "",
                "input": tool_input(fn.get("arguments") or ""),
            }
        )
    reason, sequence = stop_reason(request, response.finish_reason, bool(response.tool_calls))
    return {
        "id": message_id(request),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(response.prompt_tokens, response.completion_tokens, response.cached_tokens),
    }


class _Blocks:
    """The open content block of a translated stream and the events that open and close blocks."""

    def __init__(self) -> None:
        self.num_blocks = 0
        self.open: str | None = None  # "thinking" | "text" | "tool:<k>"
        self.tool_blocks: dict[int, int] = {}  # call index -> block index

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.num_blocks - 1})]

    def start(self, key: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.open = key
        self.num_blocks += 1
        out.append(
            event(
                "content_block_start",
                {"type": "content_block_start", "index": self.num_blocks - 1, "content_block": block},
            )
        )
        return out

    def delta(self, key: str, block: dict[str, Any], delta: dict[str, Any]) -> list[bytes]:
        out = self.start(key, block) if self.open != key else []
        out.append(
            event("content_block_delta", {"type": "content_block_delta", "index": self.num_blocks - 1, "delta": delta})
        )
        return out


def _translated(d: Delta, blocks: _Blocks, show_thinking: bool) -> list[bytes]:
    out: list[bytes] = []
    reasoning = (d.extra or {}).get("reasoning_content") if show_thinking else None
    if reasoning:
        out += blocks.delta(
            "thinking",
            {"type": "thinking", "thinking": "", "signature": ""},
            {"type": "thinking_delta", "thinking": reasoning},
        )
    text = (d.text or "") + (d.refusal or "")
    if text:
        out += blocks.delta("text", {"type": "text", "text": ""}, {"type": "text_delta", "text": text})
    for piece in d.tool_calls or []:
        k = piece.get("index", 0)
        fn = piece.get("function") or {}
        if k not in blocks.tool_blocks:
            out += blocks.start(
                f"tool:{k}",
                {"type": "tool_use", "id": piece.get("id") or f"toolu_{k}", "name": fn.get("name") or "", "input": {}},
            )
            blocks.tool_blocks[k] = blocks.num_blocks - 1
        if fn.get("arguments"):
            out.append(
                event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": blocks.tool_blocks[k],
                        "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]},
                    },
                )
            )
    return out


def _with_decisions(data: dict[str, Any], rec: Any, is_on: bool) -> dict[str, Any]:
    """``message_delta``'s data with the gateway's decisions (cost included: the stream has ended)."""
    return {**data, "tokenops": decision_values(rec)} if is_on else data


async def encode_stream(
    request: GatewayRequest, deltas: AsyncIterator[Delta], rec: Any, model: str, *, with_decisions: bool = False
) -> AsyncIterator[bytes]:
    """The event stream of a streamed Messages request (``deltas`` from ``Pipeline.open_stream``);
    ``with_decisions``: ``message_delta`` carries ``"tokenops": {...}``."""
    blocks = _Blocks()
    show_thinking = shows_thinking(request)
    is_started = is_native = False
    finish: str | None = None
    has_calls = False
    last_usage: Delta | None = None
    held: list[dict[str, Any]] = []  # an upstream's message_delta and what follows it, until the stream ends
    try:
        async for d in deltas:
            native = (d.extra or {}).get("anthropic_event")
            if native is not None:
                is_native = True
                if native.get("type") == "message_start":
                    native = {**native, "message": {**native.get("message", {}), "model": model}}
                if with_decisions and (held or native.get("type") == "message_delta"):
                    held.append(native)
                else:
                    yield event(native.get("type", "message"), native)
                continue
            if d.is_usage:
                last_usage = d
                continue
            if d.index != 0:
                continue
            if not is_started:
                is_started = True
                yield _message_start(request, model)
                yield event("ping", {"type": "ping"})
            for chunk in _translated(d, blocks, show_thinking):
                yield chunk
            has_calls = has_calls or bool(d.tool_calls)
            finish = d.finish_reason or finish
    except APIError as e:
        for native in held:  # what the upstream sent before it broke, then the error
            yield event(native.get("type", "message"), native)
        yield event("error", error_body(e))
        return
    if is_native:
        for native in held:
            if native.get("type") == "message_delta":
                native = _with_decisions(native, rec, with_decisions)
            yield event(native.get("type", "message"), native)
        return
    if not is_started:  # nothing generated (e.g. max_tokens 0): the final usage is known now
        yield _message_start(request, model, last_usage)
    for chunk in blocks.close():
        yield chunk
    reason, sequence = stop_reason(request, finish, has_calls)
    prompt = last_usage.prompt_tokens if last_usage else rec.tokens_in
    completion = (
        last_usage.completion_tokens if last_usage and last_usage.completion_tokens is not None else rec.tokens_out
    )
    cached = (last_usage.cached_tokens if last_usage else rec.tokens_cached) or 0
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": sequence},
        "usage": usage(prompt or 0, completion or 0, cached),
    }
    yield event("message_delta", _with_decisions(delta, rec, with_decisions))
    yield event("message_stop", {"type": "message_stop"})


def _message_start(request: GatewayRequest, model: str, last_usage: Delta | None = None) -> bytes:
    # sent with the first delta, by when the bundled engine has counted the prompt (``prompt_counts``):
    # no later than the first token; a chat upstream counts only at the end (message_delta has it then)
    counts = request.prompt_counts
    if counts is None and last_usage is not None:
        counts = (last_usage.prompt_tokens or 0, last_usage.cached_tokens or 0)
    prompt, cached = counts or (0, 0)
    return event(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": message_id(request),
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage(prompt, 0, cached),
            },
        },
    )
