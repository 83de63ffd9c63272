"""Anthropic Messages requests passed through to an ``openai`` upstream that serves
``/v1/messages`` (vLLM, SGLang, llama.cpp's server, Ollama, LiteLLM).

The upstream gets the body as the client sent it (its own model id in); its answer
comes back as it was sent: the message in ``GatewayResponse.extra["anthropic_message"]``,
each event in ``Delta.extra["anthropic_event"]``. The text, tool calls, stop reason and
usage are read from them too, so validators, caches, budgets and telemetry see the
answer as they see any other. An upstream that answers 404 or 405 on the path does not
serve it: the backend remembers, and this request and the next get the chat translation.
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

DEFAULT_VERSION = "2023-06-01"
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
    "pause_turn": "stop",
}


def wants_native(backend: OpenAIBackend, request: GatewayRequest) -> bool:
    return request.native is not None and request.native.api == "messages" and backend.serves_messages is not False


def _headers(backend: OpenAIBackend, request: GatewayRequest) -> dict[str, str]:
    out = {"anthropic-version": request.headers.get("anthropic-version") or DEFAULT_VERSION}
    if request.headers.get("anthropic-beta"):
        out["anthropic-beta"] = request.headers["anthropic-beta"]
    key = backend._headers.get("authorization", "")
    if key.startswith("Bearer "):  # Anthropic-native servers read x-api-key, OpenAI-compatible ones the bearer
        out["x-api-key"] = key[len("Bearer ") :]
    return out


async def _post(backend: OpenAIBackend, request: GatewayRequest, stream: bool) -> httpx.Response | None:
    assert request.native is not None
    payload = {**request.native.body, "stream": stream}
    return await native_post(backend, request, stream, payload, headers=_headers(backend, request))


async def native_once(backend: OpenAIBackend, request: GatewayRequest) -> GatewayResponse | None:
    """The upstream's Message, or None when it does not serve /v1/messages."""
    response = await _post(backend, request, stream=False)
    if response is None:
        return None
    data = json_answer(backend, response)
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise BackendError(f"{backend.name}: upstream answer is not a Message", "error", 502, backend.name)
    texts, thinking, calls = [], [], []
    for block in data["content"]:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "thinking":
            thinking.append(block.get("thinking") or "")
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input") or {})},
                }
            )
    usage = data.get("usage") or {}
    cached = usage.get("cache_read_input_tokens") or 0
    prompt = (usage.get("input_tokens") or 0) + cached + (usage.get("cache_creation_input_tokens") or 0)
    finish = _FINISH.get(data.get("stop_reason") or "end_turn", "stop")
    if data.get("stop_sequence"):
        request.decide("stop_sequence", data["stop_sequence"])
    text = "".join(texts)
    choice = {
        "index": 0,
        "text": text,
        "finish_reason": finish,
        "logprobs": None,
        "tool_calls": calls or None,
        "refusal": None,
        "message_extra": {"reasoning_content": "".join(thinking)} if thinking else None,
    }
    return GatewayResponse(
        text=text,
        model=backend.model,
        finish_reason=finish,
        tool_calls=calls or None,
        prompt_tokens=prompt,
        completion_tokens=usage.get("output_tokens") or 0,
        cached_tokens=cached,
        backend=backend.name,
        extra={"choices": [choice], "anthropic_message": data},
    )


async def native_open(backend: OpenAIBackend, request: GatewayRequest) -> httpx.Response | None:
    """The upstream's open event stream, or None when it does not serve /v1/messages."""
    return await _post(backend, request, stream=True)


async def native_deltas(backend: OpenAIBackend, response: httpx.Response) -> AsyncIterator[Delta]:
    """Each upstream event as a delta carrying it, then the usage delta."""
    tool_blocks: dict[int, int] = {}  # block index -> tool call index
    prompt = cached = output = 0
    try:
        async for line in sse_data(response):
            try:
                ev = json.loads(line[5:].strip())
            except json.JSONDecodeError:
                continue
            kind = ev.get("type") if isinstance(ev, dict) else None
            if kind is None:
                continue
            if kind == "error":
                err = ev.get("error") or {}
                raise BackendError(
                    f"{backend.name}: {err.get('message', 'upstream error')}", "error", 502, backend.name
                )
            d = Delta(extra={"anthropic_event": ev})
            if kind == "message_start":
                usage = (ev.get("message") or {}).get("usage") or {}
                cached = usage.get("cache_read_input_tokens") or 0
                prompt = (usage.get("input_tokens") or 0) + cached + (usage.get("cache_creation_input_tokens") or 0)
            elif kind == "content_block_start" and (ev.get("content_block") or {}).get("type") == "tool_use":
                block = ev["content_block"]
                k = tool_blocks[ev.get("index", 0)] = len(tool_blocks)
                d.tool_calls = [
                    {
                        "index": k,
                        "id": block.get("id"),
                        "type": "function",
                        "function": {"name": block.get("name"), "arguments": ""},
                    }
                ]
            elif kind == "content_block_delta":
                delta = ev.get("delta") or {}
                d.num_tokens = 1
                if delta.get("type") == "text_delta":
                    d.text = delta.get("text") or ""
                elif delta.get("type") == "input_json_delta" and ev.get("index", 0) in tool_blocks:
                    d.tool_calls = [
                        {
                            "index": tool_blocks[ev.get("index", 0)],
                            "function": {"arguments": delta.get("partial_json") or ""},
                        }
                    ]
            elif kind == "message_delta":
                stop = (ev.get("delta") or {}).get("stop_reason")
                d.finish_reason = _FINISH.get(stop or "end_turn", "stop")
                usage = ev.get("usage") or {}
                output = usage.get("output_tokens") or output
                if usage.get("input_tokens") is not None:
                    cached = usage.get("cache_read_input_tokens") or cached
                    prompt = usage["input_tokens"] + cached + (usage.get("cache_creation_input_tokens") or 0)
            yield d
    except httpx.TimeoutException:
        raise BackendError(f"{backend.name}: upstream timed out mid-stream", "timeout", 504, backend.name) from None
    except httpx.HTTPError as e:
        raise BackendError(f"{backend.name}: stream broke: {type(e).__name__}", "error", 502, backend.name) from None
    finally:
        await response.aclose()
    yield Delta(prompt_tokens=prompt, completion_tokens=output, cached_tokens=cached)
