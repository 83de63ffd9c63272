"""Stored ``/v1/responses`` answers (the ``stored_responses`` table): per tenant, bounded.

Every read and delete takes the tenant: a tenant never sees another's responses (a
foreign id reads as missing, so its existence does not leak either). The table is
bounded two ways, both checked when a response is saved: rows older than
``max_age_s`` are dropped, and a tenant keeps at most ``max_per_tenant`` responses
(its oldest go first). vLLM keeps stored responses in process memory and never evicts;
here they survive a restart and cannot grow without bound. A deleted tenant's
responses go with it (:func:`purge_tenant`, from ``DELETE /admin/tenants/{name}``).

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
    input_items: list[dict[str, Any]]
    response: dict[str, Any]


@dataclass(slots=True, frozen=True)
class Limits:
    """``[store] responses_max_age_hours`` and ``responses_max_per_tenant``."""

    max_age_s: float = 30 * 24 * 3600.0
    max_per_tenant: int = 10_000

    def __post_init__(self) -> None:
        assert self.max_age_s > 0 and self.max_per_tenant >= 1


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
    ) -> None:
        items, body = _dumps(input_items), _dumps(response)
        now = utcnow()
        with self._lock:
            self.store.execute(
                "INSERT OR REPLACE INTO stored_responses VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    response["id"],
                    tenant,
                    now,
                    response.get("model"),
                    previous_response_id,
                    items,
                    body,
                    len(items) + len(body),
                ],
            )
            self._evict(tenant, now)

    def _evict(self, tenant: str, now: datetime) -> None:
        self.store.execute(
            "DELETE FROM stored_responses WHERE created_at < ?", [now - timedelta(seconds=self.limits.max_age_s)]
        )
        self.store.execute(
            "DELETE FROM stored_responses WHERE tenant = ? AND id NOT IN (SELECT id FROM stored_responses "
            "WHERE tenant = ? ORDER BY created_at DESC, id DESC LIMIT ?)",
            [tenant, tenant, self.limits.max_per_tenant],
        )

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's response ``response_id``; None when missing, expired or another tenant's."""
        oldest = utcnow() - timedelta(seconds=self.limits.max_age_s)
        row = self.store.execute(
            "SELECT id, tenant, created_at, model, previous_response_id, input_items, response "
            "FROM stored_responses WHERE id = ? AND tenant = ? AND created_at >= ?",
            [response_id, tenant, oldest],
        ).fetchone()
        if row is None:
            return None
        return StoredResponse(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), json.loads(row[6]))

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._lock:
            found = self.store.execute(
                "SELECT count(*) FROM stored_responses WHERE id = ? AND tenant = ?", [response_id, tenant]
            ).fetchone()[0]
            self.store.execute("DELETE FROM stored_responses WHERE id = ? AND tenant = ?", [response_id, tenant])
        return bool(found)

    def purge_tenant(self, tenant: str) -> int:
        """Delete every stored response of ``tenant``; returns how many."""
        with self._lock:
            num = self.store.execute("SELECT count(*) FROM stored_responses WHERE tenant = ?", [tenant]).fetchone()[0]
            self.store.execute("DELETE FROM stored_responses WHERE tenant = ?", [tenant])
        return int(num)

    def count(self, tenant: str | None = None) -> int:
        if tenant is None:
            return int(self.store.execute("SELECT count(*) FROM stored_responses").fetchone()[0])
        return int(self.store.execute("SELECT count(*) FROM stored_responses WHERE tenant = ?", [tenant]).fetchone()[0])


def purge_stored_responses(store: Any, tenant: str) -> dict[str, int]:
    """What deleting a tenant reports for its stored responses (``{"stored_responses": n}``)."""
    return {"stored_responses": ResponseStore(store).purge_tenant(tenant) if store is not None else 0}
