"""One picture of several gateway replicas: their ``requests`` rows read into one in-memory store,
so ``tokenops report --store a.duckdb --store b.duckdb`` (and every named query) sees the
service, not one replica (docs/deploy.md).

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


def merged_requests(paths: Sequence[str | os.PathLike[str]], since: datetime) -> tuple[Store, list[dict[str, Any]]]:
    """An in-memory :class:`Store` with the ``requests`` rows since ``since`` of every store in
    ``paths``, and per store ``{"store", "requests"}`` (rows copied). Close the store after use.

    :raises StoreError: a store is missing or cannot be read.
    """
    merged = Store.open(":memory:")
    columns = [r[0] for r in merged.execute("SELECT * FROM requests LIMIT 0").description]
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


def _attach_copy(merged: Store, path: str, alias: str, columns: list[str], since: datetime) -> None:
    con = merged.connection
    con.execute(f"ATTACH '{path.replace(chr(39), chr(39) * 2)}' AS {alias} (READ_ONLY)")
    try:
        theirs = {r[0] for r in con.execute(f"SELECT * FROM {alias}.requests LIMIT 0").description}
        shared = [c for c in columns if c in theirs]  # an older schema lacks the newest columns
        names = ", ".join(f'"{c}"' for c in shared)
        con.execute(f"INSERT INTO requests ({names}) SELECT {names} FROM {alias}.requests WHERE ts >= ?", [since])
    finally:
        con.execute(f"DETACH {alias}")


def _channel_copy(merged: Store, path: str, columns: list[str], since: datetime) -> None:
    with open_store(path, read_only=True) as store:
        result = store.execute("SELECT * FROM requests WHERE ts >= ?", [since])
        theirs = [d[0] for d in result.description]
        rows = result.fetchall()
    shared = [c for c in theirs if c in columns]
    index = [theirs.index(c) for c in shared]
    if rows:
        names = ", ".join(f'"{c}"' for c in shared)
        marks = ", ".join("?" for _ in shared)
        merged.connection.executemany(
            f"INSERT INTO requests ({names}) VALUES ({marks})", [[row[i] for i in index] for row in rows]
        )
