"""The Response object of ``/v1/responses`` (OpenAI's shape) from the gateway's answer.

Output items in the order the model wrote them: ``reasoning`` (models with a reasoning
parser, or an upstream's ``reasoning_content``), then an assistant ``message`` with one
``output_text`` (or ``refusal``) part, then one ``function_call`` item per tool call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tokenops.gateway.responses.responses_request import ResponsesRequest, new_id
from tokenops.types import GatewayResponse


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, reasoning_tokens: int | None = None
) -> dict[str, Any]:
    # cache_write_tokens: 0, the prefix cache has no separate price for the tokens it keeps
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens or 0},
        "total_tokens": prompt_tokens + completion_tokens,
    }


def status_of(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    """``(status, incomplete_details)`` for a chat finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "id": item_id or new_id("rs"),
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def message_item(
    text: str | None,
    refusal: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    item_id: str | None = None,
    status: str = "completed",
) -> dict[str, Any]:
    if refusal:
        part: dict[str, Any] = {"type": "refusal", "refusal": refusal}
    else:
        part = {"type": "output_text", "text": text or "", "annotations": [], "logprobs": logprobs or []}
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant", "status": status, "content": [part]}


def function_call_item(call: dict[str, Any], item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    fn = call.get("function") or {}
    return {
        "id": item_id or new_id("fc"),
        "type": "function_call",
        "call_id": call.get("id") or new_id("call"),
        "name": fn.get("name", ""),
        "arguments": fn.get("arguments") or "",
        "status": status,
    }


def output_items(response: GatewayResponse) -> list[dict[str, Any]]:
    """The output of a non-streamed answer (choice 0)."""
    native = response.extra.get("responses_output")
    if isinstance(native, list):  # an upstream serving /v1/responses: its items as they came
        return native
    choice = (response.extra.get("choices") or [{}])[0]
    reasoning = (choice.get("message_extra") or {}).get("reasoning_content")
    items = [reasoning_item(reasoning)] if reasoning else []
    logprobs = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    if response.text or response.refusal or not response.tool_calls:
        items.append(message_item(response.text, response.refusal, logprobs))
    items += [function_call_item(c) for c in response.tool_calls or ()]
    return items


@dataclass(slots=True)
class ResponseFrame:
    """What every Response object of one request repeats (the request's settings)."""

    req: ResponsesRequest
    model: str
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage_value: dict[str, Any] | None = None,
        incomplete: dict[str, str] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        req = self.req
        text = dict(req.text or {})
        text.setdefault("format", {"type": "text"})
        tools = [t for t in req.tools or ()]
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": bool(req.background),
            "error": error,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": None,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
            "service_tier": "default",
            "store": req.store,
            "temperature": req.temperature if req.temperature is not None else 1.0,
            "text": text,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": tools,
            "top_logprobs": req.top_logprobs or 0,
            "top_p": req.top_p if req.top_p is not None else 1.0,
            "truncation": req.truncation or "disabled",
            "usage": usage_value,
            "user": req.user,
            "metadata": req.metadata or {},
        }

    def finished(self, response: GatewayResponse) -> dict[str, Any]:
        """The Response object of a non-streamed answer."""
        status, incomplete = status_of(response.finish_reason)
        return self.body(
            status,
            output_items(response),
            usage(
                response.prompt_tokens, response.completion_tokens, response.cached_tokens, response.reasoning_tokens
            ),
            incomplete,
        )
