"""Stored ``/v1/responses`` answers in PostgreSQL (``[shared] postgres_url``), through SQLModel.

The same rows, semantics and bounds as the embedded store
(:mod:`tokenops.store.stored_responses`), so a ``previous_response_id`` chain started on one
gateway replica continues on any other: per tenant, chains stored as links with their sums
(``chain_bytes``, ``chain_items``) on every row, deleted links kept hidden until nothing links
to them. The table is the SQLModel class :class:`tokenops.store.table_models.StoredResponseRow`,
created on first use. JSON columns hold text, byte for byte what the embedded store writes: the
bounds count the same bytes, and the ``json`` (not ``jsonb``) operators read ``output`` back
exactly as stored.

Writers (save, delete, purge) take one transaction-scoped advisory lock, so saving and evicting
is one at a time across every replica, as the embedded store's thread lock makes it within one
process. A database that cannot be reached is a 503 ``shared_state_unavailable``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlmodel import create_engine

from tokenops.errors import APIError
from tokenops.store.migrations import utcnow
from tokenops.store.stored_responses import CHAIN_SQL, SWEEP_SQL, ChainHead, Limits, StoredResponse
from tokenops.store.table_models import StoredResponseRow

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_LOCK = 0x746F6B5F72657370  # pg_advisory_xact_lock key of every writer ("tok_resp")
_TABLE: sa.Table = StoredResponseRow.__table__  # type: ignore[attr-defined]
_INDEX = sa.Index("stored_responses_tenant", _TABLE.c.tenant, _TABLE.c.created_at)

# the chain and the sweep of tokenops/store/stored_responses.py, in PostgreSQL's dialect
_CHAIN = sa.text(CHAIN_SQL.format(id=":id", tenant=":tenant", output="(s.response::json -> 'output')::text"))
_SWEEP = sa.text(SWEEP_SQL)
_INSERT = sa.text("""
INSERT INTO stored_responses (id, tenant, created_at, model, previous_response_id, input_items, response,
    num_bytes, chain_bytes, chain_items, is_whole, is_hidden)
VALUES (:id, :tenant, :created_at, :model, :prev, :items, :body, :num_bytes, :chain_bytes, :chain_items,
    :is_whole, false)
ON CONFLICT (id) DO UPDATE SET tenant = excluded.tenant, created_at = excluded.created_at,
    model = excluded.model, previous_response_id = excluded.previous_response_id,
    input_items = excluded.input_items, response = excluded.response, num_bytes = excluded.num_bytes,
    chain_bytes = excluded.chain_bytes, chain_items = excluded.chain_items, is_whole = excluded.is_whole,
    is_hidden = false
""")
_EXPIRE = sa.text("UPDATE stored_responses SET is_hidden = true WHERE NOT is_hidden AND created_at < :oldest")
_SURPLUS = sa.text(
    "UPDATE stored_responses SET is_hidden = true WHERE tenant = :tenant AND NOT is_hidden AND id NOT IN "
    "(SELECT id FROM stored_responses WHERE tenant = :tenant AND NOT is_hidden "
    "ORDER BY created_at DESC, id DESC LIMIT :keep)"
)
_SERVED = "WHERE id = :id AND tenant = :tenant AND NOT is_hidden AND created_at >= :oldest"


class PostgresResponseStore:
    """The stored responses of every gateway replica pointed at one PostgreSQL database."""

    def __init__(self, url: str, limits: Limits | None = None) -> None:
        # no connection yet: the first call (in a worker thread) connects and creates the table
        self.engine = create_engine(url, pool_pre_ping=True)
        self.limits = limits or Limits()
        self._shown = self.engine.url.render_as_string(hide_password=True)
        self._is_ready = False
        self._ready_lock = threading.Lock()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _tx(self, *, write: bool = False) -> Iterator[Connection]:
        """One transaction; a writer's holds the advisory lock every replica's writers take."""
        try:
            if not self._is_ready:
                self._create_table()
            with self.engine.begin() as con:
                if write:
                    con.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK})
                yield con
        except sa.exc.OperationalError as e:
            raise APIError(
                503,
                f"The shared store of stored responses ([shared] postgres_url = {self._shown}) cannot be "
                f"reached: {str(e.orig or e).strip().splitlines()[0]}",
                code="shared_state_unavailable",
            ) from None

    def _create_table(self) -> None:
        with self._ready_lock:
            if self._is_ready:
                return
            with self.engine.begin() as con:  # replicas starting together create it once
                con.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK})
                _TABLE.create(con, checkfirst=True)
                _INDEX.create(con, checkfirst=True)
            self._is_ready = True

    def _oldest(self) -> datetime:
        return utcnow() - timedelta(seconds=self.limits.max_age_s)

    def save(
        self,
        tenant: str,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        previous_response_id: str | None = None,
        num_history: int = 0,
    ) -> bool:
        """As :meth:`tokenops.store.stored_responses.ResponseStore.save`."""
        body = _dumps(response)
        num_outputs = len(response.get("output") or ())
        now = utcnow()
        with self._tx(write=True) as con:
            previous = _head(con, tenant, previous_response_id, None) if previous_response_id else None
            is_whole = previous is None  # the link is gone (deleted meanwhile): keep the whole turn
            own = input_items if is_whole else input_items[num_history:]
            items, num_own = _dumps(own), len(own)
            num_bytes = len(items) + len(body)
            if self.limits.bound_passed(num_bytes, previous) is not None:
                return False
            con.execute(
                _INSERT,
                {
                    "id": response["id"],
                    "tenant": tenant,
                    "created_at": now,
                    "model": response.get("model"),
                    "prev": previous_response_id,
                    "items": items,
                    "body": body,
                    "num_bytes": num_bytes,
                    "chain_bytes": num_bytes + (previous.num_chain_bytes if previous else 0),
                    "chain_items": num_own + num_outputs + (previous.num_chain_items if previous else 0),
                    "is_whole": is_whole,
                },
            )
            self._evict(con, tenant, now)
        return True

    def _evict(self, con: Connection, tenant: str, now: datetime) -> None:
        expired = con.execute(_EXPIRE, {"oldest": now - timedelta(seconds=self.limits.max_age_s)}).rowcount
        surplus = con.execute(_SURPLUS, {"tenant": tenant, "keep": self.limits.max_per_tenant}).rowcount
        if expired or surplus:
            con.execute(_SWEEP)

    def head(self, tenant: str, response_id: str) -> ChainHead | None:
        with self._tx() as con:
            return _head(con, tenant, response_id, self._oldest())

    def response(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        with self._tx() as con:
            row = con.execute(
                sa.text(f"SELECT response FROM stored_responses {_SERVED}"),
                {"id": response_id, "tenant": tenant, "oldest": self._oldest()},
            ).first()
        return None if row is None else json.loads(row[0])

    def conversation(self, tenant: str, response_id: str, with_output: bool = True) -> list[dict[str, Any]]:
        with self._tx() as con:
            return _conversation(con, tenant, response_id, with_output)

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        with self._tx() as con:  # the row and its chain in one transaction
            row = con.execute(
                sa.text(
                    "SELECT id, tenant, created_at, model, previous_response_id, response FROM stored_responses "
                    + _SERVED
                ),
                {"id": response_id, "tenant": tenant, "oldest": self._oldest()},
            ).first()
            if row is None:
                return None
            items = _conversation(con, tenant, response_id, False)
        return StoredResponse(row[0], row[1], row[2], row[3], row[4], items, json.loads(row[5]))

    def row_sizes(self, tenant: str) -> dict[str, int]:
        with self._tx() as con:
            rows = con.execute(
                sa.text("SELECT id, num_bytes FROM stored_responses WHERE tenant = :tenant ORDER BY created_at"),
                {"tenant": tenant},
            ).all()
        return {r[0]: int(r[1] or 0) for r in rows}

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._tx(write=True) as con:
            found = con.execute(
                sa.text(
                    "UPDATE stored_responses SET is_hidden = true WHERE id = :id AND tenant = :tenant AND NOT is_hidden"
                ),
                {"id": response_id, "tenant": tenant},
            ).rowcount
            if found:
                con.execute(_SWEEP)
        return bool(found)

    def purge_tenant(self, tenant: str) -> int:
        with self._tx(write=True) as con:
            num = _count(con, tenant)
            con.execute(sa.text("DELETE FROM stored_responses WHERE tenant = :tenant"), {"tenant": tenant})
        return num

    def count(self, tenant: str | None = None) -> int:
        with self._tx() as con:
            return _count(con, tenant)


def _head(con: Connection, tenant: str, response_id: str, oldest: datetime | None) -> ChainHead | None:
    """The row ``response_id`` (hidden links too unless ``oldest`` asks for a servable one)."""
    sql = "SELECT id, chain_bytes, chain_items FROM stored_responses WHERE id = :id AND tenant = :tenant"
    params: dict[str, Any] = {"id": response_id, "tenant": tenant}
    if oldest is not None:
        sql += " AND NOT is_hidden AND created_at >= :oldest"
        params["oldest"] = oldest
    row = con.execute(sa.text(sql), params).first()
    return None if row is None else ChainHead(row[0], int(row[1] or 0), int(row[2] or 0))


def _conversation(con: Connection, tenant: str, response_id: str, with_output: bool) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for own, output, depth in con.execute(_CHAIN, {"id": response_id, "tenant": tenant}).all():
        items += json.loads(own or "[]")
        if depth > 0 or with_output:
            items += json.loads(output or "[]")
    return items


def _count(con: Connection, tenant: str | None) -> int:
    if tenant is None:
        return int(con.execute(sa.text("SELECT count(*) FROM stored_responses WHERE NOT is_hidden")).scalar_one())
    return int(
        con.execute(
            sa.text("SELECT count(*) FROM stored_responses WHERE tenant = :tenant AND NOT is_hidden"),
            {"tenant": tenant},
        ).scalar_one()
    )
