"""The Batch API's state (``files`` and ``batches`` tables, migrations 11 and 12) and file bytes.

File bytes live on disk in ``<store folder>/files/<id>.jsonl`` (an uploaded input, or the
output and error files a batch appends to); their metadata and every batch's state in the
store. Every read takes the tenant: another tenant's file or batch reads as missing, and so
does a file past its ``expires_at`` (to the second, before the gateway's sweep deletes it:
:mod:`tokenops.gateway.batches.file_expiry`). Calls are blocking DuckDB work: the gateway runs
them in a worker thread.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tokenops.store.migrations import utcnow

#: batch states that still have work (the runner resumes them after a restart)
ACTIVE_STATES = ("validating", "in_progress", "finalizing", "cancelling")
_FILE_COLUMNS = (
    "id", "tenant", "purpose", "filename", "num_bytes", "num_lines", "created_at", "batch_id", "expires_at",
)  # fmt: skip
#: the condition of a file that has not expired (its one parameter: now)
IS_LIVE = "(expires_at IS NULL OR expires_at > ?)"


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def output_ids(batch_id: str) -> tuple[str, str]:
    """The output and error file ids of a batch (fixed at creation: the files are appended to)."""
    suffix = batch_id.removeprefix("batch_")
    return f"file-{suffix}-output", f"file-{suffix}-errors"


def file_row(
    file_id: str, tenant: str, purpose: str, filename: str | None, size: int, num_lines: int,
    batch_id: str | None, expires_after_s: int | None,
) -> list[Any]:  # fmt: skip
    """A ``files`` row in :data:`_FILE_COLUMNS` order, created now (and expiring ``expires_after_s`` later)."""
    now = utcnow()
    expires_at = None if expires_after_s is None else now + timedelta(seconds=expires_after_s)
    return [file_id, tenant, purpose, filename, size, num_lines, now, batch_id, expires_at]


def unix(ts: datetime | None) -> int | None:
    """A stored (naive UTC) timestamp as unix seconds, as the API shows it."""
    return None if ts is None else int(ts.replace(tzinfo=UTC).timestamp())


class BatchStore:
    """Files and batches of one store (a :class:`tokenops.store.Store`): the embedded default of
    :class:`tokenops.shared_state.batch_protocol.BatchState` (one process)."""

    is_shared = False

    def __init__(self, store: Any, files_dir: str | Path) -> None:
        self.store = store
        self.files_dir = Path(files_dir)
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._columns: list[str] | None = None

    def path(self, file_id: str) -> Path:
        return self._local(file_id)

    def _local(self, file_id: str) -> Path:
        assert file_id.startswith("file-") and "/" not in file_id and "\\" not in file_id
        return self.files_dir / f"{file_id}.jsonl"

    # -- files ----------------------------------------------------------------

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
        """Record the file written at :meth:`path`; it expires ``expires_after_s`` after now (None: never)."""
        size = os.path.getsize(self.path(file_id))
        row = file_row(file_id, tenant, purpose, filename, size, num_lines, batch_id, expires_after_s)
        marks = ", ".join("?" for _ in _FILE_COLUMNS)
        with self._lock:
            self.store.execute(f"INSERT OR REPLACE INTO files ({', '.join(_FILE_COLUMNS)}) VALUES ({marks})", row)
        return dict(zip(_FILE_COLUMNS, row))

    def file(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        """The tenant's file ``file_id``; None when it has none, or it has expired."""
        row = self.store.execute(
            f"SELECT {', '.join(_FILE_COLUMNS)} FROM files WHERE id = ? AND tenant = ? AND {IS_LIVE}",
            [file_id, tenant, utcnow()],
        ).fetchone()
        return None if row is None else dict(zip(_FILE_COLUMNS, row))

    def files(
        self,
        tenant: str,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10000,
        newest_first: bool = True,
    ) -> list[dict[str, Any]]:
        """The tenant's files that have not expired, newest first (or oldest), those past ``after`` (a file id)."""
        where = ("purpose", purpose)
        return self._page("files", _FILE_COLUMNS, tenant, after, limit, newest_first, where, live_at=utcnow())

    def num_files(self, tenant: str) -> int:
        """How many files the tenant holds (those expired, not yet swept, are not counted)."""
        row = self.store.execute(f"SELECT count(*) FROM files WHERE tenant = ? AND {IS_LIVE}", [tenant, utcnow()])
        return int(row.fetchone()[0])

    def expired_files(self, now: datetime) -> list[tuple[str, str]]:
        """``(tenant, file id)`` of every file whose ``expires_at`` is at or before ``now`` (naive UTC)."""
        rows = self.store.execute(
            "SELECT tenant, id FROM files WHERE expires_at <= ? ORDER BY expires_at, id", [now]
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def delete_file(self, tenant: str, file_id: str) -> bool:
        with self._lock:
            found = self.store.execute("DELETE FROM files WHERE id = ? AND tenant = ?", [file_id, tenant]).fetchone()[0]
        if found:
            self.path(file_id).unlink(missing_ok=True)
        return bool(found)

    def purge_tenant(self, tenant: str) -> dict[str, int]:
        """Delete every file and batch of ``tenant``: rows, and bytes on disk (a running batch's
        output and error files too; the runner stops such a batch first)."""
        with self._lock:
            file_ids = [r[0] for r in self.store.execute("SELECT id FROM files WHERE tenant = ?", [tenant]).fetchall()]
            batch_ids = [
                r[0] for r in self.store.execute("SELECT id FROM batches WHERE tenant = ?", [tenant]).fetchall()
            ]
            self.store.execute("DELETE FROM files WHERE tenant = ?", [tenant])
            self.store.execute("DELETE FROM batches WHERE tenant = ?", [tenant])
        for file_id in {*file_ids, *(f for b in batch_ids for f in output_ids(b))}:
            self._local(file_id).unlink(missing_ok=True)
        return {"files": len(file_ids), "batches": len(batch_ids)}

    # -- batches --------------------------------------------------------------

    @property
    def batch_columns(self) -> list[str]:
        if self._columns is None:
            rows = self.store.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'batches' ORDER BY ordinal_position"
            ).fetchall()
            self._columns = [r[0] for r in rows]
        return self._columns

    def add_batch(self, row: dict[str, Any]) -> dict[str, Any]:
        columns = [c for c in self.batch_columns if c in row]
        with self._lock:
            self.store.execute(
                f"INSERT INTO batches ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                [_encode(c, row[c]) for c in columns],
            )
        return self.batch(row["tenant"], row["id"]) or row

    def batch(self, tenant: str | None, batch_id: str) -> dict[str, Any] | None:
        """The batch ``batch_id`` of ``tenant`` (any tenant's when None: the runner's view)."""
        sql = f"SELECT {', '.join(self.batch_columns)} FROM batches WHERE id = ?"
        params = [batch_id]
        if tenant is not None:
            sql += " AND tenant = ?"
            params.append(tenant)
        row = self.store.execute(sql, params).fetchone()
        return None if row is None else _decode(dict(zip(self.batch_columns, row)))

    def batches(self, tenant: str, after: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        rows = self._page("batches", self.batch_columns, tenant, after, limit, True, ("status", None))
        return [_decode(r) for r in rows]

    def active_batches(self) -> list[dict[str, Any]]:
        """Every batch with work left, oldest first (the runner's queue after a restart)."""
        rows = self.store.execute(
            f"SELECT {', '.join(self.batch_columns)} FROM batches WHERE status IN ({', '.join('?' for _ in ACTIVE_STATES)}) "
            "ORDER BY created_at, id",
            list(ACTIVE_STATES),
        ).fetchall()
        return [_decode(dict(zip(self.batch_columns, r))) for r in rows]

    def recent_batches(self, limit: int = 50) -> list[dict[str, Any]]:
        """Every tenant's batches with work left, then the newest of the others (the admin view)."""
        cols = ", ".join(self.batch_columns)
        states = ", ".join("?" for _ in ACTIVE_STATES)
        rows = self.store.execute(
            f"SELECT {cols} FROM batches ORDER BY (status IN ({states})) DESC, created_at DESC, id DESC LIMIT ?",
            [*ACTIVE_STATES, limit],
        ).fetchall()
        return [_decode(dict(zip(self.batch_columns, r))) for r in rows]

    def claim(self, batch_id: str, owner: str, ttl_s: float) -> bool:
        """One process runs every batch of this store: always True."""
        return True

    # -- finished lines, for a takeover -------------------------------------

    def save_lines(self, batch_id: str, lines: list[tuple[str, bool, bytes]]) -> None:
        """Record finished lines (``custom_id``, is an error, the output line) where a replica that
        takes the batch over reads them. One process: its output and error files on disk are that
        record already, nothing to do."""

    def saved_lines(self, batch_id: str) -> list[tuple[str, bool, bytes]]:
        """The lines :meth:`save_lines` recorded (none here)."""
        return []

    def forget_lines(self, batch_id: str) -> None:
        """The batch is finished (its output files recorded): its saved lines are not needed."""

    def update_batch(self, batch_id: str, **fields: Any) -> None:
        if not fields:
            return
        with self._lock:
            self.store.execute(
                f"UPDATE batches SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                [*(_encode(k, v) for k, v in fields.items()), batch_id],
            )

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
        op = "<" if newest_first else ">"
        if after:
            sql += f" AND (created_at, id) {op} (SELECT (created_at, id) FROM {table} WHERE id = ? AND tenant = ?)"
            params += [after, tenant]
        direction = "DESC" if newest_first else "ASC"
        sql += f" ORDER BY created_at {direction}, id {direction} LIMIT ?"
        params.append(limit)
        return [dict(zip(columns, r)) for r in self.store.execute(sql, params).fetchall()]


def page_query(
    table: str, columns: Any, tenant: str, where: tuple[str, str | None], live_at: datetime | None
) -> tuple[str, list[Any]]:
    """The start of a page's query: the tenant's rows (``where``'s column equal to its value when
    that is not None; files not expired at ``live_at`` when given)."""
    sql = f"SELECT {', '.join(columns)} FROM {table} WHERE tenant = ?"
    params: list[Any] = [tenant]
    if where[1] is not None:
        sql += f" AND {where[0]} = ?"
        params.append(where[1])
    if live_at is not None:
        sql += f" AND {IS_LIVE}"
        params.append(live_at)
    return sql, params


def purge_tenant_batches(store: Any, tenant: str) -> dict[str, int]:
    """What deleting a tenant with no server running reports for its files and batches (the
    bytes live in ``<store folder>/files``, where the server keeps them)."""
    path = getattr(store, "path", None)
    if store is None or path in (None, ":memory:"):
        return {"files": 0, "batches": 0}
    return BatchStore(store, Path(path).expanduser().parent / "files").purge_tenant(tenant)


def _encode(column: str, value: Any) -> Any:
    return json.dumps(value, separators=(",", ":")) if column.endswith("_json") and value is not None else value


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for column in ("metadata_json", "errors_json"):
        if row.get(column) is not None:
            row[column] = json.loads(row[column])
    return row
