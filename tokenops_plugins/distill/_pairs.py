"""Captured pairs in the store: prune (retention), purge per tenant, read, filter, export as JSONL.

The quality filter (:func:`quality_filter`) needs no ground truth: it drops answers the
teacher did not finish (``finish_reason`` "length": cut at max_tokens) and, with a
``min_confidence`` P, answers whose mean token probability ``exp(mean logprob)`` is below P
(pairs captured without logprobs are kept and counted).

Works on a :class:`tokenops.store.Store` or the ``RemoteStore`` that ``open_store`` returns
while a server holds the file (same SQL either way)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(slots=True, frozen=True)
class Pair:
    id: str
    tenant: str
    model: str
    messages: list[dict]
    answer: str
    finish_reason: str | None = None
    mean_logprob: float | None = None

    @property
    def confidence(self) -> float | None:
        """The teacher's mean token probability (geometric), None when captured without logprobs."""
        return None if self.mean_logprob is None else math.exp(self.mean_logprob)

    @property
    def is_truncated(self) -> bool:
        return self.finish_reason == "length"

    def chat_record(self) -> dict:
        """The standard chat fine-tuning line (OpenAI / TRL / Axolotl ``messages`` format)."""
        return {"messages": [*self.messages, {"role": "assistant", "content": self.answer}]}

    @property
    def prompt(self) -> str:
        """The last user turn (what the ladder's single-turn tasks are)."""
        users = [m.get("content") for m in self.messages if m.get("role") == "user"]
        return users[-1] if users and isinstance(users[-1], str) else ""


def prune(store: Any, retention_days: float, max_rows: int) -> int:
    """Delete pairs older than ``retention_days`` and all but the newest ``max_rows`` per tenant."""
    from tokenops.store.distill_pairs import delete

    return delete(store, older_than_days=float(retention_days), max_rows_per_tenant=int(max_rows))


def purge(store: Any, tenant: str) -> int:
    """Delete every captured pair of ``tenant``; returns how many there were."""
    from tokenops.store.distill_pairs import delete

    return delete(store, tenant=tenant)


def count(store: Any, tenant: str | None = None) -> int:
    if tenant is None:
        return int(store.execute("SELECT count(*) FROM distill_pairs").fetchone()[0])
    return int(store.execute("SELECT count(*) FROM distill_pairs WHERE tenant = ?", [tenant]).fetchone()[0])


def load(store: Any, model: str | None = None, tenant: str | None = None, limit: int | None = None) -> list[Pair]:
    """Captured pairs, oldest first, optionally of one teacher ``model`` / ``tenant``."""
    where, params = [], []
    if model:
        where.append("model = ?")
        params.append(model)
    if tenant:
        where.append("tenant = ?")
        params.append(tenant)
    sql = "SELECT id, tenant, model, messages, answer, finish_reason, mean_logprob FROM distill_pairs"
    sql += (" WHERE " + " AND ".join(where)) if where else ""
    sql += " ORDER BY ts, id" + (f" LIMIT {int(limit)}" if limit else "")
    rows = store.execute(sql, params or None).fetchall()
    return [Pair(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6]) for r in rows]


@dataclass(slots=True)
class FilterCounts:
    """What :func:`quality_filter` kept and why the rest went."""

    total: int = 0
    truncated: int = 0  # finish_reason "length" (dropped unless keep_truncated)
    below_confidence: int = 0  # mean token probability < min_confidence (dropped)
    without_logprobs: int = 0  # no confidence known: kept by the confidence filter
    kept: int = 0
    min_confidence: float | None = None
    keep_truncated: bool = False

    def as_dict(self) -> dict:
        return {
            "total": self.total,
            "kept": self.kept,
            "truncated": self.truncated,
            "below_confidence": self.below_confidence,
            "without_logprobs": self.without_logprobs,
            "min_confidence": self.min_confidence,
            "keep_truncated": self.keep_truncated,
        }

    def line(self) -> str:
        parts = [f"kept {self.kept} of {self.total} pairs"]
        parts.append(f"{self.truncated} truncated " + ("kept" if self.keep_truncated else "dropped"))
        if self.min_confidence:
            parts.append(
                f"{self.below_confidence} below confidence {self.min_confidence:g} dropped, "
                f"{self.without_logprobs} without logprobs kept"
            )
        return "; ".join(parts)


def validate_min_confidence(value: float | None) -> float | None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"--min-confidence must be a mean token probability between 0 and 1, got {value:g}")
    return value


def quality_filter(
    pairs: list[Pair], min_confidence: float | None = None, keep_truncated: bool = False
) -> tuple[list[Pair], FilterCounts]:
    """Pairs that pass: not truncated (unless ``keep_truncated``) and, with ``min_confidence``,
    ``exp(mean_logprob) >= min_confidence`` (pairs without logprobs pass and are counted)."""
    validate_min_confidence(min_confidence)
    counts = FilterCounts(total=len(pairs), min_confidence=min_confidence, keep_truncated=keep_truncated)
    kept = []
    for p in pairs:
        ok = True
        if p.is_truncated:
            counts.truncated += 1
            ok = keep_truncated
        if min_confidence:
            if p.confidence is None:
                counts.without_logprobs += 1
            elif p.confidence < min_confidence:
                counts.below_confidence += 1
                ok = False
        if ok:
            kept.append(p)
    counts.kept = len(kept)
    return kept, counts


def split_heldout(pairs: list[Pair], fraction: float) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out): a stable split by request id hash, so reruns agree."""
    import hashlib

    def bucket(p: Pair) -> float:
        return int(hashlib.sha256(p.id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    return [p for p in pairs if bucket(p) >= fraction], [p for p in pairs if bucket(p) < fraction]


def export_jsonl(pairs: Iterable[Pair], path: Path) -> int:
    n = 0
    with open(path, "w") as f:
        for p in pairs:
            f.write(json.dumps(p.chat_record(), ensure_ascii=False) + "\n")
            n += 1
    return n
