"""The difficulty-adaptive thinking budget: learned from a calibration run, applied per request.

Features of a prompt: its dimension as the profile router's classifier predicts it
(``profile_router.dimension_classifier``) and its length in words (longer prompts of one
kind carry more terms to work through). A calibration run answers items at several
budgets and unlimited; :func:`learn` keeps, per (dimension, length), the smallest budget
whose accuracy stays within ``tolerance`` of the unlimited one. Lengths not seen take
the nearest longer seen length of their dimension (else the dimension's largest budget),
unseen dimensions the table's ``default`` (unlimited unless set).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable


def features(text: str) -> tuple[str, int]:
    from tokenops_plugins.multi_model.profile_router import dimension_classifier

    return dimension_classifier().predict(text), len(text.split())


@dataclass(slots=True)
class BudgetTable:
    #: dimension -> {prompt words -> budget (None: unlimited)}
    budgets: dict[str, dict[int, int | None]] = field(default_factory=dict)
    default: int | None = None
    meta: dict = field(default_factory=dict)

    def budget_for(self, text: str) -> tuple[int | None, str]:
        dim, words = features(text)
        row = self.budgets.get(dim)
        if not row:
            return self.default, f"{dim} not calibrated"
        longer = sorted(w for w in row if w >= words)
        if longer:
            return row[longer[0]], f"{dim}, {words} words"
        finite = [b for b in row.values() if b is not None]
        limit = None if None in row.values() or not finite else max(finite)
        return limit, f"{dim}, {words} words (longer than calibrated)"

    def to_json(self) -> dict:
        return {"default": self.default, "meta": self.meta,
                "budgets": {d: {str(w): b for w, b in sorted(row.items())} for d, row in self.budgets.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "BudgetTable":
        return cls({d: {int(w): b for w, b in row.items()} for d, row in data["budgets"].items()},
                   data.get("default"), data.get("meta") or {})


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> BudgetTable:
    return BudgetTable.from_json(json.loads(Path(path).read_text()))


def load_table(path: Path) -> BudgetTable | None:
    """The table at ``path`` (re-read when the file changes), or None when there is none."""
    try:
        return _load(str(path), path.stat().st_mtime)
    except (OSError, ValueError, KeyError):
        return None


def learn(results: Iterable[tuple[str, dict[int | None, bool]]], tolerance: float = 0.0,
          min_items: int = 3) -> BudgetTable:
    """A table from calibration ``results``: (prompt, {budget: correct}) with the key
    None for the unlimited run. Groups with fewer than ``min_items`` items stay unlimited."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for text, by_budget in results:
        groups.setdefault(features(text), []).append(by_budget)
    table = BudgetTable(meta={"tolerance": tolerance})
    for (dim, words), rows in sorted(groups.items()):
        budgets = sorted(b for b in rows[0] if b is not None)
        choice: int | None = None
        if len(rows) >= min_items:
            full = sum(r[None] for r in rows) / len(rows)
            for b in budgets:
                if sum(r[b] for r in rows) / len(rows) >= full - tolerance:
                    choice = b
                    break
        table.budgets.setdefault(dim, {})[words] = choice
    return table
