"""What an OpenAI-compatible upstream answers, read into the gateway's types: a chat or completions
answer as a :class:`GatewayResponse`, a stream chunk as :class:`Delta` pieces, the final usage.

Apart from :mod:`tokenops.backends.openai_http` (which sends, retries and probes) because the two
change for different reasons: this side follows the answer's shape (a new field vLLM adds, a
token count), that side the connection.
"""

from __future__ import annotations

from typing import Any

from tokenops.backends.base import Delta
from tokenops.types import BackendError, GatewayResponse

_MESSAGE_FIELDS = ("role", "content", "tool_calls", "refusal")


def answer_of(data: dict[str, Any], kind: str, model: str, backend: str) -> GatewayResponse:
    """A non-streamed answer of the upstream ``backend`` for ``model`` (the gateway's name); every
    choice is kept in ``extra["choices"]``, the first is the response's own."""
    choices = []
    for c in data.get("choices", []):
        message = c.get("message") or {}
        text = message.get("content") if kind == "chat" else c.get("text")
        choices.append(
            {
                "index": c.get("index", 0),
                "text": text or "",
                "finish_reason": c.get("finish_reason"),
                "logprobs": c.get("logprobs"),
                "tool_calls": message.get("tool_calls") or None,
                "refusal": message.get("refusal"),
                "message_extra": other_fields(message),
            }
        )
    if not choices:
        raise BackendError(f"{backend}: upstream answer has no choices", "error", 502, backend)
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return GatewayResponse(
        text=choices[0]["text"],
        model=model,
        finish_reason=choices[0]["finish_reason"],
        tool_calls=choices[0]["tool_calls"],
        refusal=choices[0]["refusal"],
        prompt_tokens=usage.get("prompt_tokens") or 0,
        completion_tokens=usage.get("completion_tokens") or 0,
        cached_tokens=details.get("cached_tokens") or 0,
        backend=backend,
        extra={"choices": choices},
        reasoning_tokens=(usage.get("completion_tokens_details") or {}).get("reasoning_tokens"),
    )


def chunk_deltas(chunk: dict[str, Any], kind: str) -> tuple[list[Delta], int]:
    """The pieces of one stream chunk worth passing on (empty keep-alive choices are dropped) and the
    tokens the chunk carried."""
    out = []
    num_tokens = 0
    for c in chunk.get("choices") or []:
        calls = refusal = other = None
        if kind == "chat":
            delta = c.get("delta") or {}
            text = delta.get("content") or ""
            calls, refusal = delta.get("tool_calls") or None, delta.get("refusal") or None
            other = other_fields(delta)
        else:
            text = c.get("text") or ""
        lp = c.get("logprobs")
        n = count_tokens(kind, lp, text or calls or refusal or other)
        num_tokens += n
        if text or c.get("finish_reason") or lp or calls or refusal or other:
            out.append(
                Delta(
                    index=c.get("index", 0),
                    text=text,
                    num_tokens=n,
                    finish_reason=c.get("finish_reason"),
                    logprobs=lp,
                    tool_calls=calls,
                    refusal=refusal,
                    extra=other,
                )
            )
    return out, num_tokens


def usage_delta(usage: dict[str, Any], num_tokens: int) -> Delta:
    """The stream's last delta: the upstream's usage, or the tokens counted when it sent none."""
    details = usage.get("prompt_tokens_details") or {}
    return Delta(
        prompt_tokens=usage.get("prompt_tokens") or 0,
        completion_tokens=usage.get("completion_tokens") or num_tokens,
        cached_tokens=details.get("cached_tokens") or 0,
        reasoning_tokens=(usage.get("completion_tokens_details") or {}).get("reasoning_tokens"),
    )


def other_fields(message: dict[str, Any]) -> dict[str, Any] | None:
    """The fields of an upstream message or delta beyond those the gateway carries itself
    (vLLM's ``reasoning_content``, OpenAI's ``annotations``/``audio``), passed on as they are."""
    other = {k: v for k, v in message.items() if k not in _MESSAGE_FIELDS and v is not None}
    return other or None


def count_tokens(kind: str, logprobs: Any, text: Any) -> int:
    """Tokens in one upstream chunk: exact when logprobs are present, else one per
    non-empty chunk (OpenAI-compatible servers send one token per chunk)."""
    if isinstance(logprobs, dict):
        if kind == "chat" and isinstance(logprobs.get("content"), list):
            return len(logprobs["content"])
        if isinstance(logprobs.get("tokens"), list):
            return len(logprobs["tokens"])
    return 1 if text else 0
