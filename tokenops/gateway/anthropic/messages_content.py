"""The content of an Anthropic Messages request (``system``, ``messages`` and their blocks) as
chat-completions messages, for :mod:`tokenops.gateway.anthropic.messages_schema`.

Kept apart from the field table because blocks are the part of the API that grows (new block
types, new block fields): each one the translation cannot carry is noted in
:class:`Untranslatable` (a 400 unless the request passes through to an upstream serving
``/v1/messages``); a malformed one raises at once.
"""

from __future__ import annotations

import json
from typing import Any

from tokenops.gateway.errors import APIError


def bad(message: str, param: str | None = None) -> APIError:
    """The 400 of a malformed field (raised at once, whatever the upstream)."""
    return APIError(400, message, code="invalid_value", param=param)


class Untranslatable(list[tuple[str, str]]):
    """``(param, message)`` of what the chat translation cannot carry: a 400 unless the request
    passes through to an upstream serving /v1/messages. ``text_only`` holds the blocks a text-only
    model cannot read (images): translated for a chat upstream, a 400 naming them on the bundled engine."""

    def __init__(self) -> None:
        super().__init__()
        self.text_only: list[tuple[str, str]] = []

    def note(self, message: str, param: str) -> None:
        self.append((param, message))

    def error(self) -> APIError | None:
        if not self:
            return None
        param, message = self[0]
        return APIError(400, message, code="unsupported_parameter", param=param)


def require(cond: bool, message: str, param: str) -> None:
    """A 400 naming ``param`` unless ``cond``."""
    if not cond:
        raise bad(f"{param}: {message}", param=param)


def _text_of(blocks: Any, param: str) -> str:
    """A string, or ``text`` blocks joined (``system``, ``tool_result`` content)."""
    if isinstance(blocks, str):
        return blocks
    require(isinstance(blocks, list), "must be a string or a list of text blocks", param)
    out = []
    for i, b in enumerate(blocks):
        require(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str),
            'must be a text block ({"type": "text", "text": ...})',
            f"{param}[{i}]",
        )
        out.append(b["text"])
    return "\n".join(out)


def _image_part(block: dict[str, Any], param: str, problems: Untranslatable) -> dict[str, Any] | None:
    source = block.get("source")
    if not isinstance(source, dict):
        raise bad(f"{param}.source: an image block needs a source", param=f"{param}.source")
    url: Any  # the client's JSON value as sent
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = source.get("url")
    else:  # e.g. "file" (Anthropic's Files API)
        problems.note(
            f"{param}.source.type {source.get('type')!r} cannot be translated: send base64 or url",
            f"{param}.source.type",
        )
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(block: dict[str, Any], param: str, problems: Untranslatable) -> dict[str, Any]:
    require(isinstance(block.get("tool_use_id"), str), "needs a string tool_use_id", f"{param}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") != "text" for b in content):
        problems.note(
            f"{param}.content: only text blocks can be translated to a chat tool message (send images "
            "in a user turn, or use a model whose upstream serves /v1/messages)",
            f"{param}.content",
        )
        content = [b for b in content if isinstance(b, dict) and b.get("type") == "text"]
    text = _text_of(content, f"{param}.content")
    if block.get("is_error"):  # chat tool messages have no error flag: the model reads it in the text
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


#: The fields of each block type the translation carries (or, like ``cache_control``, needs not).
_BLOCK_FIELDS = {
    "text": {"type", "text", "cache_control", "citations"},
    "image": {"type", "source", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
}


def _check_block(block: dict[str, Any], where: str, problems: Untranslatable) -> None:
    known = _BLOCK_FIELDS.get(block.get("type") or "")
    extra = sorted(k for k, v in block.items() if known is not None and k not in known and v is not None)
    if block.get("citations"):
        extra.append("citations")
    if extra:
        problems.note(
            f"{where}: `{extra[0]}` of a {block.get('type')} block cannot be translated to chat "
            "completions; remove it, or use a model whose upstream serves /v1/messages",
            f"{where}.{extra[0]}",
        )


def _user(content: list[dict[str, Any]], param: str, problems: Untranslatable) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        where, kind = f"{param}[{i}]", block.get("type")
        _check_block(block, where, problems)
        if kind == "text":
            require(isinstance(block.get("text"), str), "a text block needs a string text", f"{where}.text")
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            problems.text_only.append(
                (
                    f"{where}.type",
                    f"{where}: `image` blocks are not supported by this model: it reads text only. Send "
                    "text, or use a model whose upstream reads images.",
                )
            )
            part = _image_part(block, where, problems)
            if part is not None:
                parts.append(part)
        elif kind == "tool_result":
            tools.append(_tool_result(block, where, problems))
        else:
            problems.note(
                f"{where}.type {kind!r} cannot be translated to chat completions (text, image, "
                "tool_result in user turns); send it to a model whose upstream serves /v1/messages",
                f"{where}.type",
            )
    out = list(tools)  # tool results answer the previous assistant turn: they come first
    if parts:
        is_plain = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": "\n".join(p["text"] for p in parts) if is_plain else parts})
    return out


def _assistant(content: list[dict[str, Any]], param: str, problems: Untranslatable) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        where, kind = f"{param}[{i}]", block.get("type")
        _check_block(block, where, problems)
        if kind == "text":
            require(isinstance(block.get("text"), str), "a text block needs a string text", f"{where}.text")
            texts.append(block["text"])
        elif kind == "tool_use":
            require(
                isinstance(block.get("id"), str) and isinstance(block.get("name"), str),
                "a tool_use block needs a string id and name",
                where,
            )
            require(isinstance(block.get("input"), dict), "a tool_use block needs an object input", f"{where}.input")
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": json.dumps(block["input"])},
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            problems.note(
                f"{where}.type {kind!r} cannot be translated to chat completions (text, tool_use, "
                "thinking in assistant turns); send it to a model whose upstream serves /v1/messages",
                f"{where}.type",
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(data: dict[str, Any], problems: Untranslatable) -> list[dict[str, Any]]:
    """``system`` + ``messages`` as chat-completions messages."""
    out: list[dict[str, Any]] = []
    if data.get("system") is not None:
        system = _text_of(data["system"], "system")
        if system:
            out.append({"role": "system", "content": system})
    messages = data["messages"]
    require(isinstance(messages, list) and bool(messages), "must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        param = f"messages[{i}]"
        require(
            isinstance(m, dict) and m.get("role") in ("user", "assistant"),
            'needs a role of "user" or "assistant" (the system prompt is the top-level `system`)',
            param,
        )
        extra = set(m) - {"role", "content"}
        require(not extra, f"unknown field(s) {', '.join(sorted(extra))}", param)
        content = m.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        require(
            isinstance(content, list) and all(isinstance(b, dict) for b in content),
            "content must be a string or a list of content blocks",
            f"{param}.content",
        )
        if m["role"] == "user":
            out.extend(_user(content, f"{param}.content", problems))
        else:
            if i == len(messages) - 1:
                problems.note(
                    f"{param}: a last assistant message (prefill) cannot be translated: end with a user "
                    "turn, or use a model whose upstream serves /v1/messages",
                    param,
                )
            out.append(_assistant(content, f"{param}.content", problems))
    return out
