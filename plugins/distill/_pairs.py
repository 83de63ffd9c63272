"""Captured pairs in the store: prune (retention), purge per tenant, read, export as JSONL.

Works on a :class:`tokenops.store.Store` or the ``RemoteStore`` that ``open_store`` returns
while a server holds the file (same SQL either way)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable


@dataclass(slots=True, frozen=True)
class Pair:
    id: str
    tenant: str
    model: str
    messages: list[dict]
    answer: str

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
    sql = "SELECT id, tenant, model, messages, answer FROM distill_pairs"
    sql += (" WHERE " + " AND ".join(where)) if where else ""
    sql += " ORDER BY ts, id" + (f" LIMIT {int(limit)}" if limit else "")
    rows = store.execute(sql, params or None).fetchall()
    return [Pair(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in rows]


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
