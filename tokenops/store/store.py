"""``Store``: the DuckDB file, its migrations, SQLModel sessions and the telemetry writer.

Only one process may open the file read-write (DuckDB's file lock); while it
does, no other process can open it at all, not even read-only, so tools talk to
a running server through its admin API instead. Inside the server every thread
uses its own cursor of the one connection.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from tokenops.store.errors import StoreError, translate_open_error
from tokenops.store.migrations import LATEST_VERSION, apply_migrations, current_version, utcnow
from tokenops.store.writer import TelemetryWriter

DEFAULT_PATH = "store/tokenops.duckdb"


def default_path() -> str:
    """``TOKENOPS_STORE`` or ``store/tokenops.duckdb``."""
    return os.environ.get("TOKENOPS_STORE") or DEFAULT_PATH


class Store:
    """An open store file. Use :meth:`open`; close with :meth:`close` or ``with``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str, is_read_only: bool):
        self.connection = con
        self.path = path
        self.is_read_only = is_read_only
        self._engine: Any = None
        self._writer: TelemetryWriter | None = None
        self._lock = threading.Lock()
        self._session_lock = threading.Lock()
        self._is_closed = False

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, read_only: bool = False) -> Store:
        """Open (and create or upgrade, unless ``read_only``) the store at ``path``.

        :raises StoreError: the file is held by another process, is missing
            (read-only), or has a schema this version cannot use.
        """
        path = str(path) if path is not None else default_path()
        if path != ":memory:":
            path = str(Path(path).expanduser())
            if not read_only:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            con = duckdb.connect(path, read_only=read_only)
        except duckdb.Error as e:
            raise translate_open_error(path, e) from None
        try:
            version = current_version(con)
            if version > LATEST_VERSION:
                raise StoreError(
                    f"{path} has schema version {version}, newer than this tokenops knows ({LATEST_VERSION}); upgrade tokenops"
                )
            if read_only and version < LATEST_VERSION:
                raise StoreError(
                    f"{path} has schema version {version} and needs {LATEST_VERSION}; "
                    "open it read-write once (e.g. `tokenops serve`) to upgrade it"
                )
            if not read_only:
                apply_migrations(con)
        except BaseException:
            con.close()
            raise
        return cls(con, path, read_only)

    @property
    def schema_version(self) -> int:
        return current_version(self.connection.cursor())

    # -- telemetry ----------------------------------------------------------

    def writer(self, flush_interval_s: float = 0.5, max_pending_rows: int = 2_000_000) -> TelemetryWriter:
        """The store's telemetry writer, started on first call (later calls return it)."""
        if self.is_read_only:
            raise StoreError(f"{self.path} is open read-only; telemetry cannot be written")
        with self._lock:
            if self._writer is None:
                self._writer = TelemetryWriter(self.connection, flush_interval_s, max_pending_rows).start()
            return self._writer

    # -- low-rate entities through SQLModel ---------------------------------

    @property
    def engine(self) -> Any:
        """A SQLAlchemy engine whose connections are cursors of this store's connection."""
        with self._lock:
            if self._engine is None:
                from duckdb_engine import ConnectionWrapper
                from sqlalchemy import create_engine
                from sqlalchemy.pool import StaticPool

                con = self.connection
                self._engine = create_engine(
                    "duckdb:///:memory:",
                    creator=lambda: ConnectionWrapper(con.cursor()),
                    poolclass=StaticPool,
                )
            return self._engine

    @contextmanager
    def session(self) -> Iterator[Any]:
        """A SQLModel ``Session``; commits on success, rolls back on error."""
        from sqlmodel import Session

        # one session at a time: they share one cursor (StaticPool)
        with self._session_lock, Session(self.engine, expire_on_commit=False) as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def add(self, *objects: Any) -> None:
        """Insert or update (by primary key) SQLModel objects in one transaction."""
        with self.session() as s:
            for obj in objects:
                s.merge(obj)

    def record_config_change(
        self, name: str, old_value: Any, new_value: Any, actor: str | None = None, source: str | None = None
    ) -> int:
        """Audit one live tunable change; returns the change's id."""
        from tokenops.store.table_models import ConfigChange

        row = ConfigChange(
            ts=utcnow(),
            name=name,
            old_value=json.dumps(old_value, default=str),
            new_value=json.dumps(new_value, default=str),
            actor=actor,
            source=source,
        )
        with self.session() as s:
            s.add(row)
            s.flush()
            assert row.id is not None
            return row.id

    # -- queries ------------------------------------------------------------

    def execute(self, sql: str, params: Any = None) -> duckdb.DuckDBPyConnection:
        """Run SQL on a fresh cursor (safe from any thread)."""
        cur = self.connection.cursor()
        return cur.execute(sql, params) if params is not None else cur.execute(sql)

    def run_query(self, name: str, **params: Any) -> dict[str, list]:
        """Run a named query (see :mod:`tokenops.store.queries`)."""
        from tokenops.store.queries import run_query

        return run_query(self.connection, name, **params)

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Flush and stop the writer, then close the file (idempotent)."""
        if self._is_closed:
            return
        self._is_closed = True
        if self._writer is not None:
            self._writer.close()
        if self._engine is not None:
            self._engine.dispose()
        self.connection.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.is_read_only else "read-write"
        return f"Store({self.path!r}, {mode})"
