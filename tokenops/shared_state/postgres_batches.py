"""Files and batches in PostgreSQL (``[shared] postgres_url``): the Batch API's state shared by
every gateway replica of a service.

The ``files`` and ``batches`` tables are the store's own SQLModel classes
(:mod:`tokenops.store.batch_tables`), created on first use; file bytes go to ``batch_file_bytes``
when a file is recorded (an upload once checked, a batch's output and error files when it
finishes), and each replica keeps a local copy of what it reads under ``files_dir`` (fetched the
first time). Each finished line of a running batch goes to ``batch_line_results`` as it finishes
(a few at a time), so the replica that takes a batch over skips the lines already done; they are
dropped once the batch is finished. ``batch_claims`` says which replica runs a batch: a claim lasts ``ttl_s`` and the
runner renews it while it runs, so a batch runs on one replica at a time. The queries are the
embedded store's (:class:`tokenops.store.batch_store.BatchStore`, which this class extends) where
the two dialects agree, PostgreSQL's own where they do not. A database that cannot be reached is
a 503 ``shared_state_unavailable``.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import create_engine

from tokenops.errors import APIError
from tokenops.store.batch_store import _FILE_COLUMNS, BatchStore, file_row, page_query
from tokenops.store.batch_tables import BatchRow, FileRow
from tokenops.store.migrations import utcnow

_BYTES = sa.Table(
    "batch_file_bytes",
    sa.MetaData(),
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("tenant", sa.String, nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
)
_CLAIMS = sa.Table(
    "batch_claims",
    sa.MetaData(),
    sa.Column("batch_id", sa.String, primary_key=True),
    sa.Column("owner", sa.String, nullable=False),
    sa.Column("until_at", sa.DateTime, nullable=False),
)
_LINES = sa.Table(
    "batch_line_results",
    sa.MetaData(),
    sa.Column("batch_id", sa.String, primary_key=True),
    sa.Column("custom_id", sa.String, primary_key=True),
    sa.Column("is_error", sa.Boolean, nullable=False),
    sa.Column("line", sa.LargeBinary, nullable=False),
)
_CLAIM = (
    "INSERT INTO batch_claims (batch_id, owner, until_at) VALUES (%s, %s, %s) ON CONFLICT (batch_id) DO UPDATE "
    "SET owner = excluded.owner, until_at = excluded.until_at "
    "WHERE batch_claims.owner = excluded.owner OR batch_claims.until_at < %s RETURNING owner"
)
#: columns added since the tables were first created here: a database made by an older tokenops
#: lacks them (``create(checkfirst=True)`` leaves an existing table as it is)
_ADDED_COLUMNS = (
    "ALTER TABLE files ADD COLUMN IF NOT EXISTS expires_at TIMESTAMP WITHOUT TIME ZONE",
    "ALTER TABLE batches ADD COLUMN IF NOT EXISTS output_expires_s INTEGER",
)


class _Rows:
    """A DB-API result read whole (the connection goes back to the pool at once)."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows


class _Connection:
    """``execute(sql, params)`` with the embedded store's ``?`` parameters, on PostgreSQL."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url, pool_pre_ping=True)
        self.shown = self.engine.url.render_as_string(hide_password=True)
        self._is_ready = False
        self._ready_lock = threading.Lock()

    def execute(self, sql: str, params: Any = ()) -> _Rows:
        try:
            if not self._is_ready:
                self._create_tables()
            with self.engine.begin() as con:
                result = con.exec_driver_sql(sql.replace("?", "%s"), tuple(params))
                return _Rows([tuple(r) for r in result.fetchall()] if result.returns_rows else [])
        except sa.exc.OperationalError as e:
            raise APIError(
                503,
                f"The shared store of files and batches ([shared] postgres_url = {self.shown}) cannot be "
                f"reached: {str(e.orig or e).strip().splitlines()[0]}",
                code="shared_state_unavailable",
            ) from None

    def _create_tables(self) -> None:
        with self._ready_lock:
            if self._is_ready:
                return
            with self.engine.begin() as con:  # one replica at a time creates them
                con.execute(sa.text("SELECT pg_advisory_xact_lock(7631084012)"))
                for table in (FileRow.__table__, BatchRow.__table__, _BYTES, _CLAIMS, _LINES):  # type: ignore[attr-defined]
                    table.create(con, checkfirst=True)
                for statement in _ADDED_COLUMNS:
                    con.execute(sa.text(statement))
            self._is_ready = True


class PostgresBatchStore(BatchStore):
    """The files and batches of every gateway replica pointed at one PostgreSQL database."""

    is_shared = True

    def __init__(self, url: str, files_dir: str | Path) -> None:
        super().__init__(_Connection(url), files_dir)

    def close(self) -> None:
        self.store.engine.dispose()

    def path(self, file_id: str) -> Path:
        local = self._local(file_id)
        if not local.exists():
            found = self.store.execute("SELECT data FROM batch_file_bytes WHERE id = ?", [file_id]).fetchone()
            if found is not None:
                part = local.with_suffix(f".{os.getpid()}.fetch")
                part.write_bytes(bytes(found[0]))
                os.replace(part, local)
        return local

    def add_file(
        self,
        file_id: str,
        tenant: str,
        purpose: str,
        filename: str | None,
        num_lines: int,
        batch_id: str | None = None,
        expires_after_s: int | None = None,
    ) -> dict[str, Any]:
        local = self._local(file_id)
        row = file_row(file_id, tenant, purpose, filename, os.path.getsize(local), num_lines, batch_id, expires_after_s)
        columns = ", ".join(_FILE_COLUMNS)
        marks = ", ".join("?" for _ in _FILE_COLUMNS)
        updates = ", ".join(f"{c} = excluded.{c}" for c in _FILE_COLUMNS[1:])
        self.store.execute(
            "INSERT INTO batch_file_bytes (id, tenant, data) VALUES (?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET tenant = excluded.tenant, data = excluded.data",
            [file_id, tenant, local.read_bytes()],
        )
        self.store.execute(
            f"INSERT INTO files ({columns}) VALUES ({marks}) ON CONFLICT (id) DO UPDATE SET {updates}",
            row,
        )
        return dict(zip(_FILE_COLUMNS, row))

    def delete_file(self, tenant: str, file_id: str) -> bool:
        found = self.store.execute(
            "DELETE FROM files WHERE id = ? AND tenant = ? RETURNING id", [file_id, tenant]
        ).fetchone()
        if found:
            self.store.execute("DELETE FROM batch_file_bytes WHERE id = ?", [file_id])
            self._local(file_id).unlink(missing_ok=True)
        return bool(found)

    def purge_tenant(self, tenant: str) -> dict[str, int]:
        batch_ids = [r[0] for r in self.store.execute("SELECT id FROM batches WHERE tenant = ?", [tenant]).fetchall()]
        counts = super().purge_tenant(tenant)  # rows, and this replica's local copies
        self.store.execute("DELETE FROM batch_file_bytes WHERE tenant = ?", [tenant])
        for batch_id in batch_ids:
            self.store.execute("DELETE FROM batch_claims WHERE batch_id = ?", [batch_id])
            self.forget_lines(batch_id)
        return counts

    def save_lines(self, batch_id: str, lines: list[tuple[str, bool, bytes]]) -> None:
        if not lines:
            return
        values = ", ".join("(?, ?, ?, ?)" for _ in lines)
        params = [v for custom_id, is_error, line in lines for v in (batch_id, custom_id, is_error, line)]
        self.store.execute(
            f"INSERT INTO batch_line_results (batch_id, custom_id, is_error, line) VALUES {values} "
            "ON CONFLICT (batch_id, custom_id) DO NOTHING",
            params,
        )

    def saved_lines(self, batch_id: str) -> list[tuple[str, bool, bytes]]:
        rows = self.store.execute(
            "SELECT custom_id, is_error, line FROM batch_line_results WHERE batch_id = ?", [batch_id]
        ).fetchall()
        return [(r[0], bool(r[1]), bytes(r[2])) for r in rows]

    def forget_lines(self, batch_id: str) -> None:
        self.store.execute("DELETE FROM batch_line_results WHERE batch_id = ?", [batch_id])

    def claim(self, batch_id: str, owner: str, ttl_s: float) -> bool:
        now = utcnow()
        until = now + timedelta(seconds=ttl_s)
        return self.store.execute(_CLAIM, [batch_id, owner, until, now]).fetchone() is not None

    def _page(
        self,
        table: str,
        columns: Any,
        tenant: str,
        after: str | None,
        limit: int,
        newest_first: bool,
        where: tuple[str, str | None],
        live_at: datetime | None = None,
    ) -> list[dict[str, Any]]:
        sql, params = page_query(table, columns, tenant, where, live_at)
        if after:
            op = "<" if newest_first else ">"
            sql += f" AND (created_at, id) {op} (SELECT created_at, id FROM {table} WHERE id = ? AND tenant = ?)"
            params += [after, tenant]
        direction = "DESC" if newest_first else "ASC"
        sql += f" ORDER BY created_at {direction}, id {direction} LIMIT ?"
        params.append(limit)
        return [dict(zip(columns, r)) for r in self.store.execute(sql, params).fetchall()]
