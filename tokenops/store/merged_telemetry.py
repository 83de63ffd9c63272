"""One picture of several gateway replicas: their ``requests`` rows (and ``image_requests``, for
the dashboard's History screen) read into one in-memory store, so ``tokenops report --store
a.duckdb --store b.duckdb``, ``tokenops dashboard --history-store ...``, ``tokenops tune
--workload replay --history-store ...`` (and every named query on those tables) see the service,
not one replica (docs/deploy.md).

Each replica keeps writing its own DuckDB file, off the request path, as one process does; the
merge happens when someone asks. A file no process holds is attached read-only and copied in one
``INSERT ... SELECT`` (DuckDB's own bulk path); a file a running server on this machine holds is
read through that server's store channel (:func:`tokenops.store.remote.open_store`), row by row.
Only the window asked for is copied. Rows keep their own ids (UUIDs), so replicas never collide.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import duckdb

from tokenops.store.errors import StoreError
from tokenops.store.remote import open_store
from tokenops.store.store import Store


def merged_requests(
    paths: Sequence[str | os.PathLike[str]], since: datetime, tables: Sequence[str] = ("requests",)
) -> tuple[Store, list[dict[str, Any]]]:
    """An in-memory :class:`Store` with the rows since ``since`` of ``tables`` (each with a ``ts``
    column) of every store in ``paths``, and per store ``{"store", "requests"}`` (``requests``
    rows copied). Close the store after use.

    :raises StoreError: a store is missing or cannot be read.
    """
    merged = Store.open(":memory:")
    columns = {t: [r[0] for r in merged.execute(f"SELECT * FROM {t} LIMIT 0").description] for t in tables}
    counts = []
    try:
        for n, path in enumerate(paths):
            if not os.path.exists(path):
                raise StoreError(f"no store at {path}")
            before = _count(merged)
            try:
                _attach_copy(merged, str(path), f"replica_{n}", columns, since)
            except duckdb.IOException:  # held by a running server: through its channel
                _channel_copy(merged, str(path), columns, since)
            counts.append({"store": str(path), "requests": _count(merged) - before})
    except BaseException:
        merged.close()
        raise
    return merged, counts


def _count(store: Store) -> int:
    row = store.execute("SELECT count(*) FROM requests").fetchone()
    return int(row[0]) if row else 0


def _attach_copy(merged: Store, path: str, alias: str, columns: dict[str, list[str]], since: datetime) -> None:
    con = merged.connection
    con.execute(f"ATTACH '{path.replace(chr(39), chr(39) * 2)}' AS {alias} (READ_ONLY)")
    try:
        present = {
            r[0]
            for r in con.execute(f"SELECT table_name FROM duckdb_tables() WHERE database_name = '{alias}'").fetchall()
        }
        for table, ours in columns.items():
            if table not in present:  # a store older than the table has none of its rows
                continue
            theirs = {r[0] for r in con.execute(f"SELECT * FROM {alias}.{table} LIMIT 0").description}
            shared = [c for c in ours if c in theirs]  # an older schema lacks the newest columns
            names = ", ".join(f'"{c}"' for c in shared)
            con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {alias}.{table} WHERE ts >= ?", [since])
    finally:
        con.execute(f"DETACH {alias}")


def _channel_copy(merged: Store, path: str, columns: dict[str, list[str]], since: datetime) -> None:
    with open_store(path, read_only=True) as store:
        results = {}
        for table in columns:
            result = store.execute(f"SELECT * FROM {table} WHERE ts >= ?", [since])
            results[table] = ([d[0] for d in result.description], result.fetchall())
    for table, (theirs, rows) in results.items():
        shared = [c for c in theirs if c in columns[table]]
        index = [theirs.index(c) for c in shared]
        if rows:
            names = ", ".join(f'"{c}"' for c in shared)
            marks = ", ".join("?" for _ in shared)
            merged.connection.executemany(
                f"INSERT INTO {table} ({names}) VALUES ({marks})", [[row[i] for i in index] for row in rows]
            )
