"""Thinking budgets learned from recorded traffic, with no ground truth.

A reasoning model that re-checks its work (R1-style "Wait, ...") spends its first pass
computing the answer and the rest repeating it. The engine notes, per request, how the
thinking block ended (the model closed it, or a budget did) and how many content tokens
the first pass took (before the first reflection token, or the model's own close when it
did not reflect); the ``reasoning_budget`` plugin notes the prompt's features (predicted
dimension, length in words: :func:`_adaptive_budget.features`). Both land in the store's
``requests.decisions`` (``"thinking"``, ``"reasoning_features"``).

:func:`learn_from_traffic` keeps the requests that thought to completion on their own
(no budget, block closed by the model) and gives each (dimension, words) group the
``quantile`` of its first-pass lengths as its budget: a request of that group may finish
its first pass and is then stopped before the re-check. Groups with fewer than
``min_items`` requests stay unlimited. The table has the calibration table's format
(:class:`_adaptive_budget.BudgetTable`), so ``reasoning.adaptive`` serves it unchanged.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

from tokenops_plugins.model_optimization._adaptive_budget import BudgetTable


@dataclass(slots=True, frozen=True)
class TrafficSample:
    dimension: str
    words: int
    first_pass: int  # content tokens of the first pass


def quantile(values: list[int], q: float) -> int:
    """The smallest observed value with at least ``q`` of ``values`` at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def samples_from_decisions(decisions: Iterable[dict[str, Any]]) -> list[TrafficSample]:
    """The learnable samples of recorded requests (their ``decisions`` dicts): unlimited
    thinking that the model ended itself, with features and a first pass measured."""
    out = []
    for d in decisions:
        feats, thinking = d.get("reasoning_features"), d.get("thinking")
        if not feats or not thinking:
            continue
        budget = d.get("reasoning_budget") or {}
        if budget.get("max_thinking_tokens") is not None:  # a budget shaped this answer: not natural
            continue
        for closed_by, first in zip(thinking.get("closed_by") or [], thinking.get("first_pass") or []):
            if closed_by == "model" and isinstance(first, int):
                out.append(TrafficSample(str(feats["dimension"]), int(feats["words"]), first))
    return out


def samples_from_store(store: Any, model: str) -> list[TrafficSample]:
    """Samples of ``model``'s successful requests in the store (a ``Store`` or ``RemoteStore``)."""
    rows = store.execute("SELECT decisions FROM requests WHERE model_served = ? AND status = 'ok' "
                         "AND decisions LIKE '%\"thinking\"%'", [model]).fetchall()
    return samples_from_decisions(json.loads(r[0]) for r in rows if r[0])


def learn_from_traffic(samples: Iterable[TrafficSample], quantile_q: float = 0.95, min_items: int = 5) -> BudgetTable:
    """Per (dimension, words) group: the ``quantile_q`` first-pass length as the budget
    (None, unlimited, for groups with fewer than ``min_items`` samples)."""
    if not 0 < quantile_q <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile_q}")
    if min_items < 1:
        raise ValueError(f"min-items must be >= 1, got {min_items}")
    groups: dict[tuple[str, int], list[int]] = {}
    for s in samples:
        groups.setdefault((s.dimension, s.words), []).append(s.first_pass)
    table = BudgetTable(meta={"source": "traffic", "quantile": quantile_q, "min_items": min_items,
                              "samples": sum(map(len, groups.values())),
                              "group_sizes": {f"{d}/{w}": len(v) for (d, w), v in sorted(groups.items())}})
    for (dim, words), firsts in sorted(groups.items()):
        table.budgets.setdefault(dim, {})[words] = quantile(firsts, quantile_q) if len(firsts) >= min_items else None
    return table
