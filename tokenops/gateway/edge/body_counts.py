"""``[gateway] max_messages`` for the APIs whose bodies are not chat messages: the content
blocks of an Anthropic Messages body and the input items of a Responses body count as
chat's messages do.

A large body is counted before it is parsed (msgspec keeps each element as a raw slice:
counting 100,000 items takes milliseconds where building them holds the GIL for a tenth
of a second); a small one after. A Responses turn also inherits the items of its
``previous_response_id`` chain: :func:`check_count` takes them as ``num_inherited``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from tokenops.gateway.errors import APIError

#: What is counted: Anthropic content blocks (``blocks``) or Responses input items (``input``).
Unit = Literal["blocks", "input"]


class _Input(msgspec.Struct):
    input: list[msgspec.Raw] | str | None = None


class _Message(msgspec.Struct):
    content: list[msgspec.Raw] | str | None = None


class _Messages(msgspec.Struct):
    messages: list[_Message] | None = None


_INPUT = msgspec.json.Decoder(_Input)
_MESSAGES = msgspec.json.Decoder(_Messages)


def raw_count(raw: bytes, unit: Unit) -> int:
    """The items of ``raw`` before parsing (0 when the body is not what the schema wants:
    the parser and the schema then say what is wrong)."""
    try:
        if unit == "input":
            items = _INPUT.decode(raw).input
            return len(items) if isinstance(items, list) else 1
        return sum(len(m.content) if isinstance(m.content, list) else 1 for m in _MESSAGES.decode(raw).messages or ())
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return 0


def parsed_count(data: dict[str, Any], unit: Unit) -> int:
    """The items of a parsed body (what is not a list is counted once, or not at all)."""
    if unit == "input":
        items = data.get("input")
        return len(items) if isinstance(items, list) else 1
    messages = data.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(len(m["content"]) if isinstance(m, dict) and isinstance(m.get("content"), list) else 1 for m in messages)


def check_count(num_new: int, limit: int, unit: Unit, num_inherited: int = 0) -> None:
    """A 400 ``too_many_messages`` naming the field when the items pass ``limit``."""
    num = num_new + num_inherited
    if num <= limit:
        return
    if unit == "blocks":
        what, param = f"{num} content blocks", "messages"
    elif num_inherited:
        what, param = f"{num} input items ({num_inherited} from previous_response_id and {num_new} new)", "input"
    else:
        what, param = f"{num} input items", "input"
    advice = "start a new chain or send fewer" if num_inherited else "merge them or send fewer"
    raise APIError(
        400,
        f"{param}: {what} exceed this server's limit of {limit} ([gateway] max_messages); {advice}.",
        code="too_many_messages",
        param=param,
    )
