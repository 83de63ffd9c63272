"""Fitting a conversation into a token budget: keep the system messages, the newest
turns and the last message; fill the rest with the stored entries most relevant to
the last message, injected as one system message.

:class:`ContextWindow` is what the gateway knows about the routed model: its context
length and a token counter for a message list (exact for the bundled engine: its chat
template and tokenizer; an estimate of 1 token per 3 characters otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MEMORY_HEADER = "Earlier in this conversation (recalled from session memory):"


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """A safe over-estimate for tokenizers we cannot run (upstream models)."""
    return sum(len(message_text(m)) // 3 + 8 for m in messages) + 8


@dataclass(slots=True)
class ContextWindow:
    """The routed model's context: ``max_model_len`` (None: unknown) and ``count_tokens``."""

    max_model_len: int | None
    count_tokens: Callable[[list[dict[str, Any]]], int] = field(default=estimate_tokens)
    is_exact: bool = False


def window_for(replicas: list[Any]) -> ContextWindow:
    """The window of the first ready replica (the bundled engine counts exactly)."""
    for replica in replicas:
        backend = replica.backend
        if not getattr(replica, "ready", True):
            continue
        limit = getattr(backend, "max_model_len", None)
        tok = getattr(getattr(backend, "engine", None), "tokenizer", None)
        if tok is None or not hasattr(tok, "apply_chat_template"):
            return ContextWindow(limit)

        def count(messages: list[dict[str, Any]], tok: Any = tok) -> int:
            plain = [{"role": m.get("role", "user"), "content": message_text(m)} for m in messages]
            return len(tok.encode(tok.apply_chat_template(plain, add_generation_prompt=True), add_special_tokens=False))

        return ContextWindow(limit, count, True)
    return ContextWindow(None)


def fit_conversation(
    messages: list[dict[str, Any]],
    budget: int,
    count: Callable[[list[dict[str, Any]]], int],
    recalled: list[tuple[str, str]],
    recent_share: float = 0.5,
) -> tuple[list[dict[str, Any]], dict] | None:
    """Messages that fit ``budget`` tokens, or None when even the system messages plus the
    last message do not. ``recalled`` are ``(role, text)`` entries, most relevant first;
    the newest turns get up to ``recent_share`` of the room left, recalled entries the
    rest, then more turns if room remains.

    Chat templates render message by message, so a message's cost is measured once, next
    to the system messages and the last one only (short renders), and costs are summed;
    the result is then counted whole and trimmed until it fits."""
    system = [m for m in messages[:-1] if m.get("role") in ("system", "developer")]
    history = [m for m in messages[:-1] if m.get("role") not in ("system", "developer")]
    last = messages[-1]
    base = count(system + [last])
    if base > budget:
        return None

    def cost(m: dict[str, Any]) -> int:
        return count(system + [m, last]) - base

    room = budget - base
    kept: list[dict[str, Any]] = []
    used = 0
    for m in reversed(history):  # newest turns first, up to their share
        c = cost(m)
        if used + c > room * recent_share:
            break
        kept.insert(0, m)
        used += c
    shown = [message_text(m) for m in kept] + [message_text(last)]
    chosen: list[tuple[str, str]] = []
    note_cost = 0
    for role, text in recalled:
        if any(text in s for s in shown):
            continue
        c = cost(_memory_message(chosen + [(role, text)]))
        if used + c <= room:
            chosen.append((role, text))
            note_cost = c
    used += note_cost
    older = history[: len(history) - len(kept)]
    for m in reversed(older):  # room left: more of the older turns
        c = cost(m)
        if used + c > room:
            break
        kept.insert(0, m)
        used += c
    while kept and kept[0].get("role") != "user":  # start the kept turns on a user turn
        kept.pop(0)
    while True:  # the sum of costs is an estimate: check the whole
        note = [_memory_message(chosen)] if chosen else []
        fitted = system + note + kept + [last]
        total = count(fitted)
        if total <= budget:
            break
        if kept:
            kept.pop(0)
        else:
            chosen.pop()
    return fitted, {
        "dropped_turns": len(history) - len(kept),
        "injected": len(chosen),
        "kept_turns": len(kept),
        "tokens": total,
        "budget": budget,
    }


def _memory_message(entries: list[tuple[str, str]]) -> dict[str, Any]:
    lines = [MEMORY_HEADER] + [f"- {role}: {text}" for role, text in entries]
    return {"role": "system", "content": "\n".join(lines)}
