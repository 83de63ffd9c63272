"""Stored ``/v1/responses`` answers (the ``stored_responses`` table): per tenant, bounded.

Every read and delete takes the tenant: a tenant never sees another's responses (a
foreign id reads as missing, so its existence does not leak either). The table is
bounded two ways, both checked when a response is saved: rows older than
``max_age_s`` are dropped, and a tenant keeps at most ``max_per_tenant`` responses
(its oldest go first). vLLM keeps stored responses in process memory and never evicts;
here they survive a restart and cannot grow without bound. A deleted tenant's
responses go with it (:func:`purge_tenant`, from ``DELETE /admin/tenants/{name}``).

A ``previous_response_id`` chain is stored as links: each row keeps only its own turn's
input items (and its Response, whose ``output`` the next turn inherits) and names the
row before it, so a turn writes its own bytes once and never copies the earlier turns.
The conversation is read back by one recursive query over the links. Each row carries
the sums over its chain (``chain_bytes``, ``chain_items``): a new turn is checked
against the bounds (:class:`Limits`) from the previous row alone. A response that is
deleted or evicted while a later one still links to it stays as a hidden link (not
served by id) until nothing links to it any more.

Calls are blocking DuckDB work: the gateway runs them in a worker thread.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tokenops.store.migrations import utcnow

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


@dataclass(slots=True, frozen=True)
class StoredResponse:
    id: str
    tenant: str
    created_at: datetime
    model: str | None
    previous_response_id: str | None
    input_items: list[dict[str, Any]]  # the whole conversation the response answered
    response: dict[str, Any]


@dataclass(slots=True, frozen=True)
class ChainHead:
    """A stored response as the start of a next turn: what its chain holds, without reading it."""

    id: str
    num_chain_bytes: int  # stored bytes of the chain up to and including this response
    num_chain_items: int  # items a next turn inherits (input items and outputs of every turn)


@dataclass(slots=True, frozen=True)
class Limits:
    """``[store] responses_max_age_hours``, ``responses_max_per_tenant`` and ``[gateway]
    max_stored_response_bytes``, ``max_chain_bytes``."""

    max_age_s: float = 30 * 24 * 3600.0
    max_per_tenant: int = 10_000
    max_response_bytes: int = 1024 * 1024
    max_chain_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        assert self.max_age_s > 0 and self.max_per_tenant >= 1
        assert 1 <= self.max_response_bytes <= self.max_chain_bytes

    def bound_passed(self, num_row_bytes: int, previous: ChainHead | None) -> str | None:
        """The setting a row of ``num_row_bytes`` after ``previous`` would pass; None when it fits."""
        if num_row_bytes > self.max_response_bytes:
            return "max_stored_response_bytes"
        if previous is not None and previous.num_chain_bytes + num_row_bytes > self.max_chain_bytes:
            return "max_chain_bytes"
        return None


# The ids of a chain, newest first, by its links (one query; the walk stops at a row that holds
# the whole conversation itself). Depth is bounded by [gateway] max_messages: a turn adds items.
#: The chain's SQL for both stores: the parameters and the JSON access are each dialect's
#: (DuckDB here, PostgreSQL in tokenops/shared_state/postgres_responses.py).
CHAIN_SQL = """
WITH RECURSIVE chain(id, prev, is_whole, depth) AS (
    SELECT id, previous_response_id, is_whole, 0 FROM stored_responses WHERE id = {id} AND tenant = {tenant}
    UNION ALL
    SELECT r.id, r.previous_response_id, r.is_whole, c.depth + 1
    FROM stored_responses r JOIN chain c ON r.id = c.prev
    WHERE r.tenant = {tenant} AND NOT coalesce(c.is_whole, false)
)
SELECT s.input_items, {output}, c.depth
FROM chain c JOIN stored_responses s ON s.id = c.id ORDER BY c.depth DESC
"""
_CHAIN = CHAIN_SQL.format(id="$id", tenant="$tenant", output="json_extract(s.response, '$.output')")
# Hidden rows no visible row of their tenant still reaches through its links.
SWEEP_SQL = """
DELETE FROM stored_responses WHERE is_hidden AND id NOT IN (
    WITH RECURSIVE keep(id, tenant, prev, is_whole) AS (
        SELECT id, tenant, previous_response_id, is_whole FROM stored_responses WHERE NOT is_hidden
        UNION
        SELECT r.id, r.tenant, r.previous_response_id, r.is_whole
        FROM stored_responses r JOIN keep k ON r.id = k.prev AND r.tenant = k.tenant
        WHERE NOT coalesce(k.is_whole, false)
    )
    SELECT id FROM keep
)
"""


class ResponseStore:
    """The stored responses of one store (a :class:`tokenops.store.Store`)."""

    def __init__(self, store: Any, limits: Limits | None = None) -> None:
        self.store = store
        self.limits = limits or Limits()
        self._lock = threading.Lock()  # save = insert + evict, one at a time

    def save(
        self,
        tenant: str,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        previous_response_id: str | None = None,
        num_history: int = 0,
    ) -> bool:
        """Keep ``response``; ``input_items`` is the conversation it answered, of which the first
        ``num_history`` came from ``previous_response_id`` (only the rest is written). False,
        and nothing written, when the row would pass a bound of :attr:`limits`."""
        body = _dumps(response)
        num_outputs = len(response.get("output") or ())
        now = utcnow()
        with self._lock:
            previous = self._head(tenant, previous_response_id, None) if previous_response_id else None
            is_whole = previous is None  # the link is gone (deleted meanwhile): keep the whole turn
            own = input_items if is_whole else input_items[num_history:]
            items, num_own = _dumps(own), len(own)
            num_bytes = len(items) + len(body)
            if self.limits.bound_passed(num_bytes, previous) is not None:
                return False
            self.store.execute(
                "INSERT OR REPLACE INTO stored_responses (id, tenant, created_at, model, previous_response_id, "
                "input_items, response, num_bytes, chain_bytes, chain_items, is_whole, is_hidden) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, false)",
                [
                    response["id"],
                    tenant,
                    now,
                    response.get("model"),
                    previous_response_id,
                    items,
                    body,
                    num_bytes,
                    num_bytes + (previous.num_chain_bytes if previous else 0),
                    num_own + num_outputs + (previous.num_chain_items if previous else 0),
                    is_whole,
                ],
            )
            self._evict(tenant, now)
        return True

    def _evict(self, tenant: str, now: datetime) -> None:
        expired = self.store.execute(
            "UPDATE stored_responses SET is_hidden = true WHERE NOT is_hidden AND created_at < ?",
            [now - timedelta(seconds=self.limits.max_age_s)],
        ).fetchone()[0]
        surplus = self.store.execute(
            "UPDATE stored_responses SET is_hidden = true WHERE tenant = ? AND NOT is_hidden AND id NOT IN "
            "(SELECT id FROM stored_responses WHERE tenant = ? AND NOT is_hidden "
            "ORDER BY created_at DESC, id DESC LIMIT ?)",
            [tenant, tenant, self.limits.max_per_tenant],
        ).fetchone()[0]
        if expired or surplus:
            self.store.execute(SWEEP_SQL)

    def _head(self, tenant: str, response_id: str, oldest: datetime | None) -> ChainHead | None:
        """The row ``response_id`` (hidden links too unless ``oldest`` asks for a servable one)."""
        sql = "SELECT id, chain_bytes, chain_items FROM stored_responses WHERE id = ? AND tenant = ?"
        params: list[Any] = [response_id, tenant]
        if oldest is not None:
            sql += " AND NOT is_hidden AND created_at >= ?"
            params.append(oldest)
        row = self.store.execute(sql, params).fetchone()
        return None if row is None else ChainHead(row[0], int(row[1] or 0), int(row[2] or 0))

    def _oldest(self) -> datetime:
        return utcnow() - timedelta(seconds=self.limits.max_age_s)

    def head(self, tenant: str, response_id: str) -> ChainHead | None:
        """The tenant's response ``response_id`` as the start of a next turn; None when missing,
        expired, deleted or another tenant's."""
        return self._head(tenant, response_id, self._oldest())

    def response(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        """The Response object of ``response_id`` (None as for :meth:`head`), without its conversation."""
        row = self.store.execute(
            "SELECT response FROM stored_responses WHERE id = ? AND tenant = ? AND NOT is_hidden AND created_at >= ?",
            [response_id, tenant, self._oldest()],
        ).fetchone()
        return None if row is None else json.loads(row[0])

    def conversation(self, tenant: str, response_id: str, with_output: bool = True) -> list[dict[str, Any]]:
        """Every item of the chain ending at ``response_id``, oldest first: each turn's input items
        and output (``with_output=False``: without the last response's own output)."""
        items: list[dict[str, Any]] = []
        for own, output, depth in self.store.execute(_CHAIN, {"id": response_id, "tenant": tenant}).fetchall():
            items += json.loads(own or "[]")
            if depth > 0 or with_output:
                items += json.loads(output or "[]")
        return items

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's response ``response_id`` with the conversation it answered; None when
        missing, expired, deleted or another tenant's."""
        row = self.store.execute(
            "SELECT id, tenant, created_at, model, previous_response_id, response FROM stored_responses "
            "WHERE id = ? AND tenant = ? AND NOT is_hidden AND created_at >= ?",
            [response_id, tenant, self._oldest()],
        ).fetchone()
        if row is None:
            return None
        items = self.conversation(tenant, response_id, with_output=False)
        return StoredResponse(row[0], row[1], row[2], row[3], row[4], items, json.loads(row[5]))

    def row_sizes(self, tenant: str) -> dict[str, int]:
        """Stored bytes per response of ``tenant`` (hidden links included), for bounds and tests."""
        rows = self.store.execute(
            "SELECT id, num_bytes FROM stored_responses WHERE tenant = ? ORDER BY created_at", [tenant]
        ).fetchall()
        return {r[0]: int(r[1] or 0) for r in rows}

    def delete(self, tenant: str, response_id: str) -> bool:
        """Hide ``response_id``; its row goes once no later response of the tenant links to it."""
        with self._lock:
            found = self.store.execute(
                "UPDATE stored_responses SET is_hidden = true WHERE id = ? AND tenant = ? AND NOT is_hidden",
                [response_id, tenant],
            ).fetchone()[0]
            if found:
                self.store.execute(SWEEP_SQL)
        return bool(found)

    def purge_tenant(self, tenant: str) -> int:
        """Delete every stored response of ``tenant`` (links included); returns how many were served."""
        with self._lock:
            num = self.count(tenant)
            self.store.execute("DELETE FROM stored_responses WHERE tenant = ?", [tenant])
        return num

    def count(self, tenant: str | None = None) -> int:
        """Responses served by id (hidden links not counted)."""
        if tenant is None:
            return int(self.store.execute("SELECT count(*) FROM stored_responses WHERE NOT is_hidden").fetchone()[0])
        return int(
            self.store.execute(
                "SELECT count(*) FROM stored_responses WHERE tenant = ? AND NOT is_hidden", [tenant]
            ).fetchone()[0]
        )


def purge_stored_responses(store: Any, tenant: str) -> dict[str, int]:
    """What deleting a tenant reports for its stored responses (``{"stored_responses": n}``)."""
    return {"stored_responses": ResponseStore(store).purge_tenant(tenant) if store is not None else 0}
