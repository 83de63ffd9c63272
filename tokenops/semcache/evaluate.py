"""Precision and recall of a cache on labelled prompt pairs (``tests/data/semantic_cache_pairs.jsonl``).

Every distinct ``a`` prompt is stored in one cache (so the others act as
distractors); every ``b`` prompt is looked up. A hit is correct only when the
pair should hit and the answer served is ``a``'s. Precision = correct hits / hits,
recall = correct hits / pairs that should hit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenops.types import GatewayRequest, GatewayResponse


@dataclass(slots=True)
class PairScore:
    num_pairs: int = 0
    num_should_hit: int = 0
    num_hits: int = 0
    num_correct: int = 0
    false_hits: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, prompt served, b)
    missed: list[tuple[str, str, float | None, str | None]] = field(default_factory=list)  # (a, b, similarity, why)
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [pairs, hits]

    @property
    def precision(self) -> float:
        return self.num_correct / self.num_hits if self.num_hits else 1.0

    @property
    def recall(self) -> float:
        return self.num_correct / self.num_should_hit if self.num_should_hit else 0.0


def load_pairs(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _request(text: str, tenant: str = "eval") -> GatewayRequest:
    messages = [{"role": "user", "content": text}]
    return GatewayRequest(
        kind="chat", model="eval-model", body={"messages": messages}, messages=messages, tenant=tenant
    )


def score_pairs(
    cache: Any, pairs: list[dict[str, Any]], on_lookup: Callable[[], None] | None = None, is_isolated: bool = False
) -> PairScore:
    """Fill ``cache`` (a :class:`SemanticCache`) with the pairs' ``a`` prompts and look up every ``b``.

    ``is_isolated``: each pair in its own tenant (its ``a`` is the only candidate), as a
    user who asks one question and then its look-alike sees the cache; otherwise every
    ``a`` is in one tenant and the others act as distractors.
    """

    def tenant(i: int) -> str:
        return f"pair-{i}" if is_isolated else "eval"

    stored: set[tuple[str, str]] = set()
    for i, p in enumerate(pairs):
        if (tenant(i), p["a"]) not in stored:
            stored.add((tenant(i), p["a"]))
            cache.store(_request(p["a"], tenant(i)), GatewayResponse(text=f"answer to: {p['a']}", model="eval-model"))
    score = PairScore()
    for i, p in enumerate(pairs):
        response, decision = cache.lookup(_request(p["b"], tenant(i)))
        if on_lookup is not None:
            on_lookup()
        score.num_pairs += 1
        score.num_should_hit += bool(p["should_hit"])
        kind = score.by_kind.setdefault(p["kind"], [0, 0])
        kind[0] += 1
        if response is None:
            if p["should_hit"]:
                score.missed.append((p["a"], p["b"], decision.get("similarity"), decision.get("rejected")))
            continue
        kind[1] += 1
        score.num_hits += 1
        if p["should_hit"] and response.text == f"answer to: {p['a']}":
            score.num_correct += 1
        else:
            score.false_hits.append((p["kind"], response.text.removeprefix("answer to: "), p["b"]))
    return score
