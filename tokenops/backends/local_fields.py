"""The request fields the bundled engine reads beyond the basic sampling ones: penalties,
``logit_bias`` and ``min_tokens`` (into :class:`~tokenops.engine.sampling.sampling.SamplingParams`), completions'
``echo`` (the prompt and its tokens' logprobs, as the first delta of each choice), and the content
parts a text-only model cannot read (a 400 naming the part, never a silently dropped image).

Ranges were checked by the request schema (OpenAI's); what needs the model (a ``logit_bias`` token id
inside the vocabulary) is checked here.
"""

from __future__ import annotations

from typing import Any

from tokenops.backends.base import Delta
from tokenops.types import BackendError, GatewayRequest

#: Content part types the bundled engine renders as text (a refusal is an assistant's text).
TEXT_PART_TYPES = ("text", "refusal")


def bad_request(message: str, param: str, backend: str, code: str = "invalid_value") -> BackendError:
    """A 400 that names ``param`` in OpenAI's error shape."""
    err = BackendError(message, kind="bad_request", status=400, backend=backend)
    err.upstream_message = message  # type: ignore[attr-defined]
    err.upstream_code = code  # type: ignore[attr-defined]
    err.param = param  # type: ignore[attr-defined]
    return err


def check_content_parts(request: GatewayRequest, backend: str) -> None:
    """400 for the first content part the model cannot read (``image_url``, ``input_audio``, ``file``...)."""
    for i, message in enumerate(request.messages or []):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in TEXT_PART_TYPES:
                raise bad_request(
                    f"Unsupported content part type `{kind}` in messages[{i}].content[{j}]: the model "
                    f"`{request.model}` is text-only. Send text parts, or send the request to a model served by an "
                    "OpenAI-compatible upstream that reads them (the gateway passes them through there).",
                    f"messages.{i}.content.{j}.type",
                    backend,
                    code="unsupported_content_type",
                )


def processor_params(request: GatewayRequest, max_tokens: int, vocab_size: int | None, backend: str) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for the penalties, ``logit_bias`` and ``min_tokens`` of the
    request; ``max_tokens`` is its limit after the context window's cap."""
    fields = request.sampling
    out: dict[str, Any] = {}
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        if getattr(fields, name) is not None:
            out[name] = getattr(fields, name)
    bias = fields.logit_bias
    if bias:
        ids = {int(k): float(v) for k, v in bias.items()}
        outside = [t for t in ids if vocab_size is not None and t >= vocab_size]
        if outside:
            assert vocab_size is not None  # only a known vocabulary has ids outside it
            raise bad_request(
                f"logit_bias: token id {outside[0]} is outside the vocabulary of the model (ids 0 to {vocab_size - 1})",
                "logit_bias",
                backend,
            )
        out["logit_bias"] = ids
    min_tokens = fields.min_tokens
    if min_tokens:
        asked = request.max_tokens if fields.is_max_tokens_sent else None  # the client's limit, not the default
        if asked is not None and min_tokens > asked:
            raise bad_request(f"min_tokens ({min_tokens}) must not exceed max_tokens ({asked})", "min_tokens", backend)
        out["min_tokens"] = min(min_tokens, max_tokens)  # the context may cap max_tokens: the cap wins
    return out


def echo_logprobs(request: GatewayRequest) -> int | None:
    """``SamplingParams.prompt_logprobs`` for a completion: its ``logprobs`` when it echoes the prompt
    (0 when it scores with ``max_tokens: 0`` and no logprobs: the engine needs the field to allow it)."""
    output = request.output
    if request.kind != "completion" or not output.echo:
        return None
    if output.logprobs is not None:
        return int(output.logprobs)
    return 0 if request.max_tokens == 0 else None


def echo_delta(
    request: GatewayRequest, index: int, prompt_ids: list[int], entries: list[dict | None] | None, tokenizer: Any
) -> Delta:
    """The first delta of choice ``index`` of an ``echo`` completion: the prompt as sent (token ids
    decoded) and, when logprobs were asked, its tokens' logprobs (the first null, as OpenAI and vLLM)."""
    prompt = request.prompt
    text = prompt if isinstance(prompt, str) else tokenizer.decode(prompt_ids, skip_special_tokens=False)
    logprobs = None
    if request.output.logprobs is not None and entries is not None:
        name = getattr(tokenizer, "token_text", None) or tokenizer.id_to_token
        logprobs = {
            "tokens": [name(t) for t in prompt_ids],
            "token_logprobs": [None if e is None else e["logprob"] for e in entries],
            "top_logprobs": [
                None if e is None else {t["token"]: t["logprob"] for t in e.get("top") or []} for e in entries
            ],
            "text_offset": [],
        }
    return Delta(index=index, text=text, num_tokens=0, logprobs=logprobs)
