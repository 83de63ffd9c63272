"""The difficulty-adaptive thinking budget: learned from a calibration run (:func:`learn`, with
ground truth) or from recorded traffic (:mod:`._traffic_budget`, without), applied per request.

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path


def features(text: str) -> tuple[str, int]:
    from ..multi_model.profile_router import dimension_classifier

    return dimension_classifier().predict(text), len(text.split())


@dataclass(slots=True)
class BudgetTable:
    #: dimension -> {prompt words -> budget (None: unlimited)}
    budgets: dict[str, dict[int, int | None]] = field(default_factory=dict)
    default: int | None = None
    meta: dict = field(default_factory=dict)

    def budget_for(self, text: str, feats: tuple[str, int] | None = None) -> tuple[int | None, str]:
        dim, words = feats or features(text)
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
        return {
            "default": self.default,
            "meta": self.meta,
            "budgets": {d: {str(w): b for w, b in sorted(row.items())} for d, row in self.budgets.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> BudgetTable:
        return cls(
            {d: {int(w): b for w, b in row.items()} for d, row in data["budgets"].items()},
            data.get("default"),
            data.get("meta") or {},
        )


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> BudgetTable:
    return BudgetTable.from_json(json.loads(Path(path).read_text()))


def load_table(path: Path) -> BudgetTable | None:
    """The table at ``path`` (re-read when the file changes), or None when there is none."""
    try:
        return _load(str(path), path.stat().st_mtime)
    except (OSError, ValueError, KeyError):
        return None


def learn(
    results: Iterable[tuple[str, dict[int | None, bool], int]], tolerance: float = 0.0, min_items: int = 3
) -> BudgetTable:
    """A table from calibration ``results``: (prompt, {budget: correct}, unlimited thinking
    tokens), the key None being the unlimited run.

    Per group, first the smallest budget that loses no calibration item. Then, while the
    items lost in all stay within ``tolerance`` of the calibration set, groups move to
    smaller budgets in order of thinking tokens saved per item lost. Groups with fewer
    than ``min_items`` items stay unlimited."""
    groups: dict[tuple[str, int], list[tuple[dict, int]]] = {}
    results = list(results)
    for text, by_budget, thinking in results:
        groups.setdefault(features(text), []).append((by_budget, thinking))

    def lost(rows, b) -> int:
        return sum(r[None] for r, _ in rows) - sum(r[b] for r, _ in rows)

    def spent(rows, b) -> int:  # thinking tokens the group spends under budget b (None: unlimited)
        return sum(t if b is None else min(t, b + 3) for _, t in rows)

    choice: dict[tuple[str, int], int | None] = {}
    for key, rows in groups.items():
        budgets = sorted(b for b in rows[0][0] if b is not None)
        choice[key] = None if len(rows) < min_items else next((b for b in budgets if lost(rows, b) <= 0), None)
    allowed = int(tolerance * len(results) + 1e-9)
    while allowed > 0:
        best = None
        for key, rows in groups.items():
            if len(rows) < min_items:
                continue
            now = choice[key]
            for b in sorted(b for b in rows[0][0] if b is not None and (now is None or b < now)):
                extra = lost(rows, b) - lost(rows, now) if now is not None else lost(rows, b)
                saved = spent(rows, now) - spent(rows, b)
                if 0 < extra <= allowed and saved > 0 and (best is None or saved / extra > best[0]):
                    best = (saved / extra, key, b, extra)
        if best is None:
            break
        _, key, b, extra = best
        choice[key], allowed = b, allowed - extra
    table = BudgetTable(meta={"tolerance": tolerance})
    for (dim, words), b in sorted(choice.items()):
        table.budgets.setdefault(dim, {})[words] = b
    return table
