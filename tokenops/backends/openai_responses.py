"""Responses API requests passed through to an ``openai`` upstream that serves
``/v1/responses`` (vLLM, SGLang, llama.cpp's server, Ollama, another tokenops).

The upstream gets the request as the client wrote it (``GatewayRequest.native``: every
field, the conversation resolved by the gateway); an upstream that answers 404 or 405
there is remembered as one that does not, and gets the translated chat request from
then on (what the translation could not carry is then a 400 naming it).
A non-streamed answer keeps the upstream's output items as they came
(``extra["responses_output"]``); a streamed one becomes :class:`Delta` objects, so the
gateway's accounting, caches and validators see it like any chat stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from tokenops.backends.base import Delta
from tokenops.backends.native_upstream import json_answer, native_post
from tokenops.backends.sse import sse_data
from tokenops.types import BackendError, GatewayRequest, GatewayResponse

#: An ``OpenAIBackend`` (tokenops.backends.openai_http, which imports this module).
OpenAIBackend = Any


def wants_responses(backend: OpenAIBackend, request: GatewayRequest) -> bool:
    return request.native is not None and request.native.api == "responses" and backend.serves_responses is not False


async def _post(backend: OpenAIBackend, request: GatewayRequest, stream: bool) -> httpx.Response | None:
    """The upstream's answer, or None when it has no ``/v1/responses`` (remembered)."""
    assert request.native is not None
    native = request.native.body
    payload = {**native, "stream": stream, "max_output_tokens": native.get("max_output_tokens") or request.max_tokens}
    return await native_post(backend, request, stream, payload)


async def responses_once(backend: OpenAIBackend, request: GatewayRequest) -> GatewayResponse | None:
    """The upstream's Response as the gateway's answer, or None when it does not serve the API."""
    response = await _post(backend, request, stream=False)
    if response is None:
        return None
    return answer(json_answer(backend, response), backend.model, backend.name)


async def responses_stream(backend: OpenAIBackend, request: GatewayRequest) -> AsyncIterator[Delta] | None:
    """The upstream's events as deltas, or None when it does not serve the API."""
    response = await _post(backend, request, stream=True)
    if response is None:
        return None

    async def run() -> AsyncIterator[Delta]:
        try:
            async for delta in deltas(sse_data(response), backend.name):
                yield delta
        except httpx.TimeoutException:
            raise BackendError(f"{backend.name}: upstream timed out mid-stream", "timeout", 504, backend.name) from None
        except httpx.HTTPError as e:
            raise BackendError(
                f"{backend.name}: stream broke: {type(e).__name__}", "error", 502, backend.name
            ) from None
        finally:
            await response.aclose()

    return run()


def _finish(data: dict[str, Any], has_calls: bool) -> str:
    reason = (data.get("incomplete_details") or {}).get("reason")
    if data.get("status") == "incomplete":
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if has_calls else "stop"


def _usage(usage: dict[str, Any] | None) -> tuple[int, int, int, int | None]:
    usage = usage or {}
    return (
        usage.get("input_tokens") or 0,
        usage.get("output_tokens") or 0,
        (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0,
        (usage.get("output_tokens_details") or {}).get("reasoning_tokens"),
    )


def answer(data: Any, model: str, backend: str) -> GatewayResponse:
    """A non-streamed Response from the upstream as the gateway's answer."""
    output = data.get("output") if isinstance(data, dict) else None
    if not isinstance(output, list):
        raise BackendError(f"{backend}: upstream Response has no output list", "error", 502, backend)
    texts, refusals, reasoning, calls = [], [], [], []
    for item in output:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "message":
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    texts.append(part.get("text") or "")
                elif part.get("type") == "refusal":
                    refusals.append(part.get("refusal") or "")
        elif kind == "reasoning":
            reasoning += [p.get("text") or "" for p in item.get("content") or () if isinstance(p, dict)]
        elif kind == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""},
                }
            )
    prompt, completion, cached, thinking = _usage(data.get("usage"))
    text, finish = "".join(texts), _finish(data, bool(calls))
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "finish_reason": finish,
        "logprobs": None,
        "tool_calls": calls or None,
        "refusal": "".join(refusals) or None,
        "message_extra": {"reasoning_content": "".join(reasoning)} if reasoning else None,
    }
    return GatewayResponse(
        text=text,
        model=model,
        finish_reason=finish,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        backend=backend,
        tool_calls=calls or None,
        refusal=choice["refusal"],
        reasoning_tokens=thinking,
        extra={"choices": [choice], "responses_output": output},
    )


async def deltas(events: AsyncIterator[bytes], backend: str) -> AsyncIterator[Delta]:
    """The upstream's event stream (its ``data:`` lines) as deltas, the usage delta last."""
    calls: dict[str, int] = {}  # output item id -> tool call index
    num_tokens, final = 0, None
    async for line in events:
        try:
            event = json.loads(line[5:].strip())
        except json.JSONDecodeError:
            continue
        kind = event.get("type")
        delta: Delta | None = None
        if kind == "response.output_text.delta":
            delta = Delta(text=event.get("delta") or "", num_tokens=1)
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            delta = Delta(extra={"reasoning_content": event.get("delta") or ""}, num_tokens=1)
        elif kind == "response.refusal.delta":
            delta = Delta(refusal=event.get("delta") or "", num_tokens=1)
        elif kind == "response.output_item.added" and (event.get("item") or {}).get("type") == "function_call":
            item = event["item"]
            calls[item.get("id")] = k = len(calls)
            delta = Delta(
                tool_calls=[
                    {
                        "index": k,
                        "id": item.get("call_id"),
                        "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""},
                    }
                ]
            )
        elif kind == "response.function_call_arguments.delta" and event.get("item_id") in calls:
            delta = Delta(
                tool_calls=[{"index": calls[event["item_id"]], "function": {"arguments": event.get("delta")}}],
                num_tokens=1,
            )
        elif kind in ("response.completed", "response.incomplete"):
            final = event.get("response") or {}
        elif kind in ("error", "response.failed"):
            err = event.get("error") or (event.get("response") or {}).get("error") or event
            raise BackendError(f"{backend}: {err.get('message', 'upstream error')}", "error", 502, backend)
        if delta is not None:
            num_tokens += delta.num_tokens
            yield delta
    if final is None:
        raise BackendError(
            f"{backend}: the upstream's event stream ended before response.completed", "error", 502, backend
        )
    yield Delta(finish_reason=_finish(final, bool(calls)))
    prompt, completion, cached, thinking = _usage(final.get("usage"))
    yield Delta(
        prompt_tokens=prompt,
        completion_tokens=completion or num_tokens,
        cached_tokens=cached,
        reasoning_tokens=thinking,
    )
