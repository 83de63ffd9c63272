"""Response bodies and SSE chunks in exactly the shapes OpenAI sends.

Streams: chat sends a first chunk with ``delta.role = "assistant"``, then content
deltas, a chunk with ``finish_reason`` (empty delta), a usage chunk with
``choices: []`` when ``stream_options.include_usage``, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
from typing import Any

from tokenops.types import GatewayRequest, GatewayResponse

DONE = b"data: [DONE]\n\n"
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def response_id(request: GatewayRequest) -> str:
    suffix = request.id.split("-", 1)[-1]
    return ("chatcmpl-" if request.kind == "chat" else "cmpl-") + suffix


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int | None = None
) -> dict[str, Any]:
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if reasoning_tokens is not None:  # thinking tokens, when the backend counts them
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def chat_message(choice: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of one collected chat choice (``text``, ``tool_calls``,
    ``refusal``): content is null when the model only called tools or refused, as OpenAI sends it."""
    tool_calls = choice.get("tool_calls")
    text = choice.get("text")
    is_null = (tool_calls or choice.get("refusal")) and not text
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if is_null else (text or ""),
        "refusal": choice.get("refusal"),
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    for key, value in (choice.get("message_extra") or {}).items():  # an upstream's other fields
        message.setdefault(key, value)
    return message


def response_body(request: GatewayRequest, response: GatewayResponse, model: str) -> bytes:
    """The non-streamed JSON answer."""
    choices_in = response.extra.get("choices") or [
        {
            "index": 0,
            "text": response.text,
            "finish_reason": response.finish_reason,
            "logprobs": None,
            "tool_calls": response.tool_calls,
            "refusal": response.refusal,
        }
    ]
    choices = []
    for c in choices_in:
        if request.kind == "chat":
            choices.append(
                {
                    "index": c["index"],
                    "message": chat_message(c),
                    "logprobs": c.get("logprobs"),
                    "finish_reason": c.get("finish_reason") or "stop",
                }
            )
        else:
            choices.append(
                {
                    "index": c["index"],
                    "text": c["text"],
                    "logprobs": c.get("logprobs"),
                    "finish_reason": c.get("finish_reason") or "stop",
                }
            )
    body = {
        "id": response_id(request),
        "object": "chat.completion" if request.kind == "chat" else "text_completion",
        "created": int(request.arrival),
        "model": model,
        "choices": choices,
        "usage": usage(
            response.prompt_tokens, response.completion_tokens, response.cached_tokens, response.reasoning_tokens
        ),
        "system_fingerprint": None,
    }
    return _dumps(body).encode("utf-8")


class ChunkWriter:
    """Formats one request's stream; keeps the id, created time and model fixed."""

    def __init__(self, request: GatewayRequest, model: str) -> None:
        self.is_chat = request.kind == "chat"
        self.include_usage = request.output.include_usage
        self._head: dict[str, Any] = {
            "id": response_id(request),
            "object": "chat.completion.chunk" if self.is_chat else "text_completion",
            "created": int(request.arrival),
            "model": model,
            "system_fingerprint": None,
        }

    def _chunk(
        self, choices: list[dict[str, Any]], usage_value: Any = None, decisions: dict[str, Any] | None = None
    ) -> bytes:
        body = dict(self._head)
        body["choices"] = choices
        if self.include_usage:
            body["usage"] = usage_value
        if decisions:
            body["tokenops"] = decisions
        return b"data: " + _dumps(body).encode("utf-8") + b"\n\n"

    def role(self, index: int) -> bytes:
        """The first chunk of a chat choice (completions have none)."""
        assert self.is_chat
        return self._chunk(
            [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
        )

    def content(self, index: int, text: str, logprobs: Any = None) -> bytes:
        if self.is_chat:
            choice = {"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}
        return self._chunk([choice])

    def tool_calls(self, index: int, pieces: list[dict[str, Any]]) -> bytes:
        """Tool-call pieces (``Delta.tool_calls``), forwarded as they came."""
        return self._chunk([{"index": index, "delta": {"tool_calls": pieces}, "logprobs": None, "finish_reason": None}])

    def refusal(self, index: int, text: str) -> bytes:
        return self._chunk([{"index": index, "delta": {"refusal": text}, "logprobs": None, "finish_reason": None}])

    def other(self, index: int, fields: dict[str, Any]) -> bytes:
        """An upstream's other delta fields (``Delta.extra``), forwarded as they came."""
        return self._chunk([{"index": index, "delta": dict(fields), "logprobs": None, "finish_reason": None}])

    def finish(self, index: int, reason: str, decisions: dict[str, Any] | None = None) -> bytes:
        if self.is_chat:
            choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": index, "text": "", "logprobs": None, "finish_reason": reason}
        return self._chunk([choice], None, decisions)

    def usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        reasoning_tokens: int | None = None,
        decisions: dict[str, Any] | None = None,
    ) -> bytes:
        assert self.include_usage
        return self._chunk([], usage(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens), decisions)
