"""Thinking control for the bundled engine: the request's budget (from the
``tokenops_reasoning_budget`` hook) turned into the engine's token-level
:class:`tokenops.engine.sampling.thinking.ThinkingControl`.

Request fields: ``reasoning_effort`` (OpenAI's ``none``/``minimal``/``low``/``medium``/
``high``) and the extension ``max_thinking_tokens`` (an integer >= 0). Both need a model
with a ``reasoning_parser`` and a loaded budget policy; otherwise the request gets a 400
rather than a silently ignored field.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from tokenops.types import BackendError, GatewayRequest, OutputFields, ReasoningBudget

EFFORTS = ("none", "minimal", "low", "medium", "high")
#: Words whose tokens mark a re-check: the engine notes where the first one falls (the end of
#: the first pass) whatever the policy, so budgets can be learned from traffic.
REFLECTION_WORDS = ("Wait", "Hmm")


def requested_budget_fields(fields: OutputFields) -> dict[str, Any]:
    """The budget fields the request sets (validated; a bad value is a ValueError)."""
    out: dict[str, Any] = {}
    effort = fields.reasoning_effort
    if effort is not None:
        if effort not in EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {', '.join(EFFORTS)}, got {effort!r}")
        out["reasoning_effort"] = effort
    limit = fields.max_thinking_tokens
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"max_thinking_tokens must be an integer >= 0, got {limit!r}")
        out["max_thinking_tokens"] = limit
    return out


BudgetPolicy = Callable[[GatewayRequest, str], "ReasoningBudget | None"]


def _no_policy(request: GatewayRequest, model: str) -> ReasoningBudget | None:
    return None


def decide_budget(
    request: GatewayRequest, model: str, has_parser: bool, backend: str, get_budget: BudgetPolicy = _no_policy
) -> ReasoningBudget | None:
    """Validate the request's budget fields and ask the policy, ``get_budget`` (the
    ``tokenops_reasoning_budget`` hook, passed in by the backend's builder; none by default);
    400s as ``BackendError``."""
    try:
        asked = requested_budget_fields(request.output)
    except ValueError as e:
        raise BackendError(str(e), kind="bad_request", status=400, backend=backend) from None
    if asked and (request.kind != "chat" or not has_parser):
        name = next(iter(asked))
        raise BackendError(
            f"`{name}` needs a chat request to a reasoning model (one with a `reasoning_parser` in "
            f"[[models]]); `{model}` has none",
            kind="bad_request",
            status=400,
            backend=backend,
        )
    if not has_parser or request.kind != "chat":
        return None
    budget = get_budget(request, model)
    if budget is None and asked:
        raise BackendError(
            f"`{next(iter(asked))}` needs the reasoning_budget plugin (it is disabled)",
            kind="bad_request",
            status=400,
            backend=backend,
        )
    return budget


@lru_cache(maxsize=8)
def _line_end_ids(tokenizer: Any) -> frozenset[int]:
    text = tokenizer.token_text if hasattr(tokenizer, "token_text") else tokenizer.id_to_token
    return frozenset(i for i in range(tokenizer.vocab_size) if (text(i) or "").endswith("\n"))


@lru_cache(maxsize=32)
def reflection_token_ids(tokenizer: Any, words: tuple[str, ...]) -> tuple[int, ...]:
    """Ids of the vocabulary tokens that are one of ``words`` once stripped of spaces
    and punctuation ("Wait", " Wait", "Wait,"), in any letter case the word is given in."""
    if not words:
        return ()
    text = tokenizer.token_text if hasattr(tokenizer, "token_text") else tokenizer.id_to_token
    wanted = set(words)
    return tuple(i for i in range(tokenizer.vocab_size) if (text(i) or "").strip().strip(",.!:;") in wanted)


def thinking_control(
    tokenizer: Any, open_tag: str, close_tag: str, budget: ReasoningBudget | None, starts_thinking: bool = False
) -> Any:
    """The engine's per-request control for these tags and ``budget`` (counting only when None)."""
    from tokenops.engine.sampling.thinking import ThinkingControl

    encode = lambda s: tuple(tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
    return ThinkingControl(
        open_ids=encode(open_tag),
        close_ids=encode(close_tag),
        budget=budget.max_thinking_tokens if budget is not None else None,
        suppress_ids=reflection_token_ids(tokenizer, tuple(budget.suppress)) if budget is not None else (),
        newline_ids=encode("\n"),
        line_end_ids=_line_end_ids(tokenizer),
        starts_thinking=starts_thinking,
        eos_ids=tuple(getattr(tokenizer, "eos_token_ids", ()) or ()),
        reflection_ids=frozenset(
            reflection_token_ids(tokenizer, REFLECTION_WORDS + tuple(budget.suppress if budget is not None else ()))
        ),
    )
