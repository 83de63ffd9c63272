"""Replay traffic recorded in the store's ``requests`` table: the same prompt and
answer lengths at the same (time-scaled) inter-arrival times."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenops.bench.request import BenchRequest, WorkloadError
from tokenops.bench.synthetic import words

if TYPE_CHECKING:
    from tokenops.store.remote import RemoteStore


def _seconds(ts: dt.datetime | float | str) -> float:
    if isinstance(ts, dt.datetime):
        return ts.timestamp()
    return float(ts)


def load_recorded(store: str | list[str], limit: int) -> list[tuple[float, int, int]]:
    """(time, tokens_in, tokens_out) of the first ``limit`` successful recorded requests; several
    stores (gateway replicas') are read as one (:mod:`tokenops.store.merged_telemetry`)."""
    import duckdb

    if not isinstance(store, str):
        if len(store) != 1:
            return _load_merged(store, limit)
        store = store[0]
    if not Path(store).is_file():
        raise WorkloadError(f"store {store} does not exist; pass --store PATH of a tokenops store")
    con: duckdb.DuckDBPyConnection | RemoteStore
    try:
        con = duckdb.connect(store, read_only=True)
    except duckdb.Error as e:
        from tokenops.store.errors import is_lock_error
        from tokenops.store.remote import connect_server

        # held by a running server: read through its store socket (same SELECTs, same rows)
        remote = connect_server(store) if is_lock_error(e) else None
        if remote is None:
            raise WorkloadError(f"cannot open store {store}: {e}") from None
        con = remote
    return _select_recorded(con, store, limit)


def _load_merged(stores: list[str], limit: int) -> list[tuple[float, int, int]]:
    from tokenops.store.errors import StoreError
    from tokenops.store.merged_telemetry import merged_requests
    from tokenops.store.queries import parse_since

    try:
        merged, _ = merged_requests(stores, parse_since("all"))
    except StoreError as e:
        raise WorkloadError(f"cannot read the stores to replay: {e}") from None
    return _select_recorded(merged, " + ".join(stores), limit)


def _select_recorded(con: Any, store: str, limit: int) -> list[tuple[float, int, int]]:
    """The recorded requests of ``con`` (closed after)."""
    try:
        cols = {
            r[0]
            for r in con.execute(
                "select column_name from information_schema.columns where table_name = 'requests'"
            ).fetchall()
        }
        missing = {"ts", "tokens_in", "tokens_out"} - cols
        if missing:
            raise WorkloadError(f"store {store} has no usable requests table (missing {', '.join(sorted(missing))})")
        where = "where tokens_in > 0 and tokens_out > 0"
        if "status" in cols:
            where += " and (status is null or cast(status as varchar) in ('ok', '200', 'success'))"
        rows = con.execute(
            f"select ts, tokens_in, tokens_out from requests {where} order by ts limit ?", [limit]
        ).fetchall()
    finally:
        con.close()
    return [(_seconds(t), int(i), int(o)) for t, i, o in rows]


def replay(
    num_requests: int, seed: int = 0, store: str | list[str] | None = None, time_scale: float = 1.0, **_: object
) -> list[BenchRequest]:
    """Up to ``num_requests`` recorded requests (of several stores, read as one, when ``store``
    is a list); gaps are multiplied by ``time_scale`` (0.5 replays twice as fast)."""
    if not time_scale > 0:
        raise WorkloadError(f"time_scale must be positive, got {time_scale}")
    store = store or os.environ.get("TOKENOPS_STORE") or "store/tokenops.duckdb"
    rows = load_recorded(store, num_requests)
    if not rows:
        raise WorkloadError(f"store {store} has no recorded requests to replay")
    rng = np.random.default_rng(seed)
    t0 = rows[0][0]
    return [
        BenchRequest(
            [{"role": "user", "content": words(n_in, rng)}],
            max_tokens=n_out,
            num_prompt_tokens=n_in,
            arrival_s=(t - t0) * time_scale,
        )
        for t, n_in, n_out in rows
    ]
