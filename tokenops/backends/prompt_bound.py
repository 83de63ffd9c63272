"""A context-length check that costs microseconds: refuse a prompt that cannot fit
before tokenizing it.

No token of a vocabulary covers more than ``M`` characters (``M`` is measured
once per tokenizer: the longest decoded vocabulary entry), so a prompt of ``C``
characters has at least ``C / M`` tokens. Normalizers can fold a few characters
into one (NFKC composition), hence the slack factor. A prompt refused here would
have been refused after tokenization too; everything else is tokenized as before
(in a worker thread).
"""

from __future__ import annotations

import threading
from typing import Any

from tokenops.types import BackendError

#: Characters a normalizer may fold into one before tokenization (a safe over-estimate).
NORMALIZER_SLACK = 4
_cache: dict[int, int] = {}
_lock = threading.Lock()


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` decodes to (cached per tokenizer)."""
    key = id(tokenizer)
    with _lock:
        cached = _cache.get(key)
    if cached is not None:
        return cached
    longest = 1
    for token_id in range(int(getattr(tokenizer, "vocab_size", 0) or 0)):
        longest = max(longest, len(tokenizer.token_text(token_id)))
    with _lock:
        _cache[key] = longest
    return longest


def prompt_chars(request: Any) -> int:
    """Characters of the request's text (chat contents or the completion prompt)."""
    if request.kind == "chat":
        total = 0
        for m in request.messages or []:
            content = m.get("content")
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        return total
    prompt = request.prompt
    return len(prompt) if isinstance(prompt, str) else 0


def check_prompt_fits(request: Any, tokenizer: Any, max_model_len: int | None, backend: str) -> None:
    """Raise a ``context_length`` :class:`BackendError` when the prompt certainly exceeds ``max_model_len``."""
    if not max_model_len or tokenizer is None:
        return
    chars = prompt_chars(request)
    # the cheap test first: most prompts are far below any bound
    if chars <= max_model_len:
        return
    min_tokens = chars // (max_token_chars(tokenizer) * NORMALIZER_SLACK)
    if min_tokens >= max_model_len:
        raise BackendError(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt of {chars} "
            f"characters has at least {min_tokens} tokens. Please reduce the length of the prompt.",
            kind="context_length",
            status=400,
            backend=backend,
        )
