"""Cheap token estimates of a request before any tokenizer has seen it."""

from __future__ import annotations

from typing import Any

#: Characters per token of English text for BPE vocabularies (a common rule of thumb).
CHARS_PER_TOKEN = 4.0


def request_text(request: Any) -> str:
    """The prompt as one string, role-tagged for chats so that two conversations
    with the same words in different roles do not share a prefix."""
    messages = getattr(request, "messages", None)
    if messages is not None:
        parts = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"<{m.get('role', 'user')}>{content or ''}\n")
        return "".join(parts)
    prompt = getattr(request, "prompt", None)
    return prompt if isinstance(prompt, str) else ""


def estimate_prompt_tokens(request: Any) -> int:
    """Prompt tokens: exact for token-id prompts, ``len(text) / 4`` otherwise."""
    prompt = getattr(request, "prompt", None)
    if isinstance(prompt, list):
        return len(prompt)
    return max(1, int(len(request_text(request)) / CHARS_PER_TOKEN + 0.5))


def estimate_request_tokens(request: Any) -> int:
    """Prompt plus the decode budget (``max_tokens``): the cost a request may reach."""
    return estimate_prompt_tokens(request) + max(0, int(getattr(request, "max_tokens", 0) or 0))


def session_key(request: Any) -> str | None:
    """The session a request belongs to: ``session_id``, the ``x-session-id`` header,
    or the OpenAI ``user`` field, in that order."""
    sid = getattr(request, "session_id", None)
    if sid:
        return str(sid)
    headers = getattr(request, "headers", None) or {}
    for name, value in headers.items():
        if name.lower() == "x-session-id" and value:
            return str(value)
    user = (getattr(request, "body", None) or {}).get("user")
    return str(user) if user else None


def cache_key(request: Any) -> str | None:
    """The client's ``prompt_cache_key`` (chat, Responses): requests that share one share a
    long prefix, so they should meet the same replica's prefix cache."""
    key = (getattr(request, "body", None) or {}).get("prompt_cache_key")
    return key if isinstance(key, str) and key else None
