"""The latest requests from the store's ``requests`` table, in the shape ``GET /admin/requests``
lists them (``RequestRecord.summary`` in tokenops/gateway/observability/records.py), so the list survives a
restart of the server: the gateway merges these rows with the requests it still holds in memory
(which the batched writer may not have flushed yet)."""

from __future__ import annotations

import json
from typing import Any

#: Columns of ``requests`` as the summary names them (``ts`` read back as epoch seconds).
COLUMNS = (
    "id",
    "tenant",
    "api_key_id",
    "model_requested",
    "model_served",
    "backend",
    "replica",
    "route_reason",
    "router",
    "cache_hit",
    "escalated",
    "ensemble_members",
    "tokens_in",
    "tokens_out",
    "tokens_cached",
    "reasoning_tokens",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "status",
    "error_kind",
    "http_status",
    "stream",
    "cost_usd",
    "decisions",
)


def _json_or_none(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:  # written by an older version, or cut: show it as it is
        return text


def latest_requests(store: Any, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` newest rows of ``requests``, newest first. Fields the table does not keep
    (``kind``, ``error``, ``finish_reason``) are None; ``decisions`` is parsed back into an object."""
    cols = ", ".join(COLUMNS)
    rows = store.execute(
        f"SELECT {cols}, epoch_us(ts) FROM requests ORDER BY ts DESC, id DESC LIMIT ?", [int(limit)]
    ).fetchall()
    out = []
    for row in rows:
        item = dict(zip(COLUMNS, row[:-1]))
        item["ts"] = None if row[-1] is None else row[-1] / 1e6
        item["ensemble_members"] = _json_or_none(item["ensemble_members"])
        item["decisions"] = _json_or_none(item["decisions"]) or {}
        item.update(kind=None, error=None, finish_reason=None)
        out.append(item)
    return out


def merge_newest(recent: list[dict[str, Any]], stored: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """``recent`` (this process's, complete) and ``stored`` (the store's, possibly from earlier runs) as
    one list, newest first, each request once (the in-memory entry wins), at most ``limit``."""
    seen = {r["id"] for r in recent}
    merged = recent + [r for r in stored if r["id"] not in seen]
    merged.sort(key=lambda r: (r.get("ts") or 0.0, r["id"]), reverse=True)
    return merged[:limit]
