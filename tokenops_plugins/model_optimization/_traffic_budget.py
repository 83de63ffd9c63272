"""Thinking budgets learned from recorded traffic, with no ground truth.

A reasoning model that re-checks its work (R1-style "Wait, ...") spends its first pass
computing the answer and the rest repeating it. The engine notes, per request, how the
thinking block ended (the model closed it, or a budget did) and how many content tokens
the first pass took (before the first reflection token, or the model's own close when it
did not reflect); the ``reasoning_budget`` plugin notes the prompt's features (predicted
dimension, length in words: :func:`_adaptive_budget.features`). Both land in the store's
``requests.decisions`` (``"thinking"``, ``"reasoning_features"``).

:func:`learn_from_traffic` keeps the requests that thought to completion on their own
(no budget, block closed by the model). A budget ``B`` leaves such a request whole when it
stops it exactly where its first pass ends (``B == first_pass``: the re-check is skipped,
the answer is already written) or does not stop it at all (``B >= spent``, its whole
thinking); any other ``B`` cuts it mid-pass or mid-re-check, and the model then answers
from a partial line (measured: docs/reasoning.md). Per (dimension, words) group the
budget is the smallest candidate (the group's first-pass and whole lengths) that leaves
at least ``coverage`` of the group's requests whole. In a group of one kind of item all
first passes are alike and the budget is that length; a group that mixes kinds (the
classifier calls some largest-of prompts "math") gets the length that stops none of them
wrongly, which saves less. Groups with fewer than ``min_items`` requests stay unlimited.
The table has the calibration table's format (:class:`_adaptive_budget.BudgetTable`), so
``reasoning.adaptive`` serves it unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ._adaptive_budget import BudgetTable


@dataclass(slots=True, frozen=True)
class TrafficSample:
    dimension: str
    words: int
    first_pass: int  # content tokens before the first reflection token (or the model's close)
    spent: int  # content tokens of the whole block


def is_whole(budget: int, sample: TrafficSample) -> bool:
    """Whether ``budget`` leaves ``sample``'s answer as unlimited thinking had it."""
    return budget == sample.first_pass or budget >= sample.spent


def group_budget(samples: list[TrafficSample], coverage: float) -> int | None:
    """The smallest candidate budget leaving at least ``coverage`` of ``samples`` whole."""
    for b in sorted({s.first_pass for s in samples} | {s.spent for s in samples}):
        if sum(is_whole(b, s) for s in samples) >= coverage * len(samples) - 1e-9:
            return b
    return None


def samples_from_decisions(decisions: Iterable[dict[str, Any]]) -> list[TrafficSample]:
    """The learnable samples of recorded requests (their ``decisions`` dicts): unlimited
    thinking that the model ended itself, with features and its lengths measured."""
    out = []
    for d in decisions:
        feats, thinking = d.get("reasoning_features"), d.get("thinking")
        if not feats or not thinking:
            continue
        budget = d.get("reasoning_budget") or {}
        if budget.get("max_thinking_tokens") is not None:  # a budget shaped this answer: not natural
            continue
        for closed_by, first, spent in zip(
            thinking.get("closed_by") or [], thinking.get("first_pass") or [], thinking.get("spent") or []
        ):
            if closed_by == "model" and isinstance(first, int) and isinstance(spent, int):
                out.append(TrafficSample(str(feats["dimension"]), int(feats["words"]), first, spent))
    return out


def samples_from_store(store: Any, model: str) -> list[TrafficSample]:
    """Samples of ``model``'s successful requests in the store (a ``Store`` or ``RemoteStore``)."""
    rows = store.execute(
        "SELECT decisions FROM requests WHERE model_served = ? AND status = 'ok' AND decisions LIKE '%\"thinking\"%'",
        [model],
    ).fetchall()
    return samples_from_decisions(json.loads(r[0]) for r in rows if r[0])


def learn_from_traffic(samples: Iterable[TrafficSample], coverage: float = 0.95, min_items: int = 5) -> BudgetTable:
    """Per (dimension, words) group, :func:`group_budget` (None, unlimited, for groups with
    fewer than ``min_items`` samples)."""
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    if min_items < 1:
        raise ValueError(f"min-items must be >= 1, got {min_items}")
    groups: dict[tuple[str, int], list[TrafficSample]] = {}
    for s in samples:
        groups.setdefault((s.dimension, s.words), []).append(s)
    table = BudgetTable(
        meta={
            "source": "traffic",
            "coverage": coverage,
            "min_items": min_items,
            "samples": sum(map(len, groups.values())),
            "group_sizes": {f"{d}/{w}": len(v) for (d, w), v in sorted(groups.items())},
        }
    )
    for (dim, words), rows in sorted(groups.items()):
        table.budgets.setdefault(dim, {})[words] = group_budget(rows, coverage) if len(rows) >= min_items else None
    return table
