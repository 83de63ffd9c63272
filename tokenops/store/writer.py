"""``TelemetryWriter``: batched, background appends of telemetry rows.

``write`` / ``write_many`` only append to an in-memory queue (a few hundred
nanoseconds under a lock that no I/O ever holds), so the request path never
waits for the disk. A daemon thread flushes the queue every
``flush_interval_s`` and on :meth:`TelemetryWriter.close`; one flush is one
transaction, so a crash loses at most the rows queued since the last flush.

Rows are turned into one NumPy array per column and inserted with
``INSERT ... SELECT`` from the registered arrays: DuckDB scans them column-wise,
which is two orders of magnitude faster than ``executemany``. Missing keys become
NULL, ``ts`` defaults to the time of the ``write`` call, keys that are not
columns are ignored with a warning, and dict/list values of JSON columns are
serialised. Rows are queued by reference, not copied: do not change a dict
after writing it.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import repeat
from typing import Any

import duckdb
import numpy as np

from tokenops.store.table_models import TELEMETRY_MODELS, column_kinds

log = logging.getLogger("tokenops.store")

_NUMERIC = ("int", "float", "bool")
_SQL_TYPE = {
    "int": "BIGINT",
    "float": "DOUBLE",
    "bool": "BOOLEAN",
    "str": "VARCHAR",
    "json": "VARCHAR",
    "ts": "TIMESTAMP",
}


@dataclass(slots=True)
class WriterStats:
    """Counters of a writer since it started."""

    num_written: int = 0
    num_dropped: int = 0  # queue full or a failed insert
    num_flushes: int = 0
    num_pending: int = 0
    last_flush_s: float = 0.0  # duration of the last flush
    last_flush_rows: int = 0
    last_error: str | None = None


class TelemetryWriter:
    """Queue telemetry rows and append them to DuckDB from a background thread.

    :param con: a DuckDB connection; the writer uses its own cursor of it.
    :param flush_interval_s: longest time a row waits in the queue (<= 1 s).
    :param max_pending_rows: beyond this many queued rows new rows are dropped
        and counted, so a stuck disk cannot exhaust memory.
    """

    def __init__(
        self, con: duckdb.DuckDBPyConnection, flush_interval_s: float = 0.5, max_pending_rows: int = 2_000_000
    ):
        if not 0 < flush_interval_s <= 1.0:
            raise ValueError(f"flush_interval_s must be in (0, 1], got {flush_interval_s}")
        self.flush_interval_s = flush_interval_s
        self.max_pending_rows = max_pending_rows
        self._cursor = con.cursor()
        self._kinds = {t: column_kinds(t) for t in TELEMETRY_MODELS}
        self._columns = {t: {c for c, _ in kinds} for t, kinds in self._kinds.items()}
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        # one queue of rows and one of default timestamps per table, swapped whole at each flush
        self._rows, self._stamps = self._new_queues()
        self._num_pending = 0
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._num_requested = 0  # flush requests made / served, for flush()
        self._num_served = 0
        self._is_closing = False
        self._is_closed = False
        self._stats = WriterStats()
        self._thread = threading.Thread(target=self._run, name="tokenops-telemetry-writer", daemon=True)

    # -- producer side ------------------------------------------------------

    def accepts(self, table: str) -> bool:
        """Whether ``table`` is one of the telemetry tables this writer appends to."""
        return table in self._kinds

    def write(self, table: str, row: dict[str, Any], ts: float | None = None) -> bool:
        """Queue one row; returns False when it was dropped (queue full or closed).

        :param ts: default for the row's ``ts`` (epoch seconds); now when None.
        """
        with self._lock:
            if self._is_closing or self._num_pending >= self.max_pending_rows:
                self._stats.num_dropped += 1
                return False
            try:
                self._rows[table].append(row)
            except KeyError:
                raise ValueError(f"unknown telemetry table {table!r}; one of: {', '.join(self._kinds)}") from None
            self._stamps[table].append(time.time() if ts is None else ts)
            self._num_pending += 1
        return True

    def write_many(self, table: str, rows: list[dict[str, Any]], ts: float | None = None) -> bool:
        """Queue a list of rows as one item (cheaper than calling ``write`` per row)."""
        if table not in self._kinds:
            raise ValueError(f"unknown telemetry table {table!r}; one of: {', '.join(self._kinds)}")
        if not rows:
            return True
        when = time.time() if ts is None else ts
        with self._lock:
            if self._is_closing or self._num_pending + len(rows) > self.max_pending_rows:
                self._stats.num_dropped += len(rows)
                return False
            self._rows[table].extend(rows)
            self._stamps[table].extend(repeat(when, len(rows)))
            self._num_pending += len(rows)
        return True

    def _new_queues(self) -> tuple[dict[str, deque], dict[str, deque]]:
        return {t: deque() for t in self._kinds}, {t: deque() for t in self._kinds}

    @property
    def num_pending(self) -> int:
        return self._num_pending

    @property
    def stats(self) -> WriterStats:
        """Live counters (the object is updated in place by the writer thread)."""
        self._stats.num_pending = self._num_pending
        return self._stats

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> TelemetryWriter:
        if not self._thread.is_alive():
            self._thread.start()
            atexit.register(self.close)
        return self

    def flush(self, timeout: float = 30.0) -> None:
        """Write everything queued before this call; returns when it is committed."""
        if not self._thread.is_alive():
            self._flush_once()
            return
        with self._done:
            self._num_requested += 1
            target = self._num_requested
            self._wake.set()
            if not self._done.wait_for(lambda: self._num_served >= target, timeout=timeout):
                raise TimeoutError(f"telemetry flush did not finish within {timeout} s")

    def close(self, timeout: float = 30.0) -> None:
        """Flush what is queued, stop the thread and release the cursor (idempotent)."""
        if self._is_closed:
            return
        with self._lock:
            self._is_closing = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        else:
            self._flush_once()
        self._is_closed = True
        atexit.unregister(self.close)
        try:
            self._cursor.close()
        except duckdb.Error:  # the store closed the database first
            pass

    def __enter__(self) -> TelemetryWriter:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- consumer side ------------------------------------------------------

    def _run(self) -> None:
        next_at = time.monotonic() + self.flush_interval_s
        while True:
            self._wake.wait(max(0.0, next_at - time.monotonic()))
            self._wake.clear()
            next_at = time.monotonic() + self.flush_interval_s
            closing = self._is_closing
            self._flush_once()
            if closing:
                return

    def _flush_once(self) -> None:
        with self._done:
            serving = self._num_requested
        fresh = self._new_queues()
        with self._lock:
            (rows, stamps), (self._rows, self._stamps) = (self._rows, self._stamps), fresh
            self._num_pending = 0
        batch = {t: (list(q), list(stamps[t])) for t, q in rows.items() if q}
        started = time.perf_counter()
        num_rows = self._insert_batch(batch) if batch else 0
        self._stats.last_flush_s = time.perf_counter() - started
        self._stats.last_flush_rows = num_rows
        self._stats.num_flushes += 1
        with self._done:
            self._num_served = max(self._num_served, serving)
            self._done.notify_all()

    def _insert_batch(self, by_table: dict[str, tuple[list[dict[str, Any]], list[float]]]) -> int:
        """Insert ``{table: (rows, default timestamps)}`` in one transaction; returns rows written."""
        cur = self._cursor
        try:
            cur.execute("BEGIN TRANSACTION")
            for table, (rows, stamps) in by_table.items():
                self._insert_rows(table, rows, stamps)
            cur.execute("COMMIT")
            num = sum(len(r) for r, _ in by_table.values())
            self._stats.num_written += num
            return num
        except Exception as e:  # one bad table must not lose the others: retry each alone
            cur.execute("ROLLBACK")
            log.warning("telemetry flush failed (%s); retrying table by table", e)
        num = 0
        for table, (rows, stamps) in by_table.items():
            try:
                cur.execute("BEGIN TRANSACTION")
                self._insert_rows(table, rows, stamps)
                cur.execute("COMMIT")
                num += len(rows)
            except Exception as e:
                cur.execute("ROLLBACK")
                self._stats.num_dropped += len(rows)
                self._stats.last_error = f"{table}: {type(e).__name__}: {e}"
                log.error("dropped %d %s telemetry rows: %s", len(rows), table, e)
        self._stats.num_written += num
        return num

    def _insert_rows(self, table: str, rows: list[dict[str, Any]], stamps: list[float]) -> None:
        kinds = self._kinds[table]
        present = set().union(*rows)
        for key in present - self._columns[table]:
            if (table, key) not in self._warned:
                self._warned.add((table, key))
                log.warning("telemetry table %s has no column %r; the value is ignored", table, key)
        arrays = {}
        for name, kind in kinds:
            if name in present:
                values = [r.get(name) for r in rows]
            elif name == "ts":
                values = [None] * len(rows)
            else:  # absent from every row: skip the per-row lookups
                arrays[name] = (
                    np.full(len(rows), np.nan) if kind in _NUMERIC else np.full(len(rows), None, dtype=object)
                )
                continue
            arrays[name] = _to_array(kind, values, stamps if name == "ts" else None)
        view = f"_tokenops_batch_{table}"
        self._cursor.register(view, arrays)
        try:
            select = ", ".join(f"CAST({n} AS {_SQL_TYPE[k]})" for n, k in kinds)
            # by name: a column a later migration appended sits last in the table, not where the model lists it
            names = ", ".join(n for n, _ in kinds)
            self._cursor.execute(f"INSERT INTO {table} ({names}) SELECT {select} FROM {view}")
        finally:
            self._cursor.unregister(view)


def _to_array(kind: str, values: list[Any], default_stamps: list[float] | None) -> np.ndarray:
    """One column as a NumPy array DuckDB can scan (NaN in a float array reads as NULL)."""
    if kind in _NUMERIC:
        return np.array(values, dtype=np.float64)
    if kind == "ts":
        return _timestamps(values, default_stamps)
    if kind == "json":
        values = [v if v is None or isinstance(v, str) else json.dumps(v, default=str) for v in values]
    return np.array(values, dtype=object)


def _timestamps(values: list[Any], default_stamps: list[float] | None) -> np.ndarray:
    """Epoch seconds or datetimes (naive = UTC) as ``datetime64[us]``; None takes the default."""
    if default_stamps is not None:
        values = [d if v is None else v for v, d in zip(values, default_stamps)]
    try:
        secs = np.array(values, dtype=np.float64)
    except TypeError:
        secs = np.array([_epoch(v) for v in values], dtype=np.float64)
    out = np.empty(len(secs), dtype="datetime64[us]")
    valid = ~np.isnan(secs)
    out[valid] = np.round(secs[valid] * 1e6).astype(np.int64).astype("datetime64[us]")
    out[~valid] = np.datetime64("NaT")
    return out


def _epoch(v: Any) -> float:
    if v is None:
        return float("nan")
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=UTC)
        return v.timestamp()
    return float(v)
