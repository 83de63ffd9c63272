"""``[gateway] max_messages`` for the prompt list of ``/v1/completions``: each prompt of a
batched ``prompt`` counts as a message (a list of token ids is one prompt).

A large body is counted before it is parsed (msgspec keeps each prompt as a raw slice): a
body of 100,000 one-letter prompts took 0.4 s to be refused by the request schema (pydantic
tries every form of ``prompt`` on it), counting it takes milliseconds.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tokenops.gateway.errors import APIError


class _Prompt(msgspec.Struct):
    prompt: list[msgspec.Raw] | str | None = None


_PROMPT = msgspec.json.Decoder(_Prompt)


def raw_prompt_count(raw: bytes) -> int:
    """Prompts in ``raw`` before parsing (0 when the body has none or is not what the schema
    wants: the parser and the schema then say what is wrong)."""
    try:
        prompt = _PROMPT.decode(raw).prompt
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return 0
    if not isinstance(prompt, list):
        return 1 if prompt is not None else 0
    first = bytes(prompt[0]).lstrip()[:1] if prompt else b""
    return 1 if first[:1] in (b"-", *(bytes([d]) for d in b"0123456789")) else len(prompt)


def parsed_prompt_count(data: dict[str, Any]) -> int:
    prompt = data.get("prompt")
    if not isinstance(prompt, list):
        return 1 if prompt is not None else 0
    return 1 if prompt and isinstance(prompt[0], int) else len(prompt)


def check_prompt_count(num: int, limit: int) -> None:
    """A 400 ``too_many_messages`` naming ``prompt`` past ``limit`` prompts."""
    if num > limit:
        raise APIError(
            400,
            f"prompt: {num} prompts exceed this server's limit of {limit} ([gateway] max_messages); "
            "send fewer per request.",
            code="too_many_messages",
            param="prompt",
        )
