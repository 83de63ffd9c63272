"""The batched telemetry writer: periodic and closing flushes, no blocking, conversions."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

import pytest

from tokenops.store.writer import TelemetryWriter

from store_helpers import DAY1, epoch


def _count(store, table="requests"):
    return store.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_rows_appear_within_the_flush_interval_without_explicit_flush(store):
    writer = store.writer(flush_interval_s=0.2)
    writer.write("requests", {"id": "a", "model_served": "m"})
    started = time.monotonic()
    while _count(store) == 0:
        # generous: a loaded machine may be slow, but without the periodic flush the row never comes
        assert time.monotonic() - started < 30.0, "row not flushed by the periodic flush"
        time.sleep(0.02)
    flushes = writer.stats.num_flushes
    time.sleep(0.5)
    assert writer.stats.num_flushes >= flushes + 1  # it keeps flushing on its own


def test_close_flushes_queued_rows(store):
    writer = TelemetryWriter(store.connection, flush_interval_s=1.0).start()
    writer.write_many("requests", [{"id": f"r{i}"} for i in range(1000)])
    writer.write("engine_stats", {"replica": "r0", "num_running": 2})
    writer.close()
    assert _count(store) == 1000
    assert _count(store, "engine_stats") == 1
    assert writer.stats.num_written == 1001
    assert writer.write("requests", {"id": "late"}) is False  # closed writers refuse, never raise
    writer.close()  # idempotent


def test_store_close_flushes_its_writer(tmp_path):
    from tokenops.store import Store

    path = tmp_path / "s.duckdb"
    store = Store.open(path)
    store.writer(flush_interval_s=1.0).write("requests", {"id": "x"})
    store.close()
    with Store.open(path, read_only=True) as again:
        assert _count(again) == 1


class _SlowWriter(TelemetryWriter):
    """Holds each flush for ``delay_s`` to show producers never wait for it."""

    delay_s = 0.8

    def _insert_batch(self, batch):
        self.in_flush.set()
        time.sleep(self.delay_s)
        self.flush_ends.append(time.perf_counter())
        return super()._insert_batch(batch)


def test_write_does_not_block_during_a_slow_flush(store):
    writer = _SlowWriter(store.connection, flush_interval_s=0.1)
    writer.in_flush, writer.flush_ends = threading.Event(), []
    writer.start()
    writer.write("requests", {"id": "first"})
    assert writer.in_flush.wait(2.0)
    for i in range(2000):
        writer.write("requests", {"id": f"r{i}", "tokens_in": i})
    writes_done = time.perf_counter()
    assert writer.num_pending == 2000  # queued, not written, while the flush still sleeps
    writer.close()
    assert writes_done < writer.flush_ends[0], "write() waited for the slow flush"
    assert _count(store) == 2001


def test_flush_waits_for_commit_and_converts_values(store):
    writer = store.writer()
    ts = epoch(DAY1)
    writer.write(
        "requests",
        {
            "id": "r1", "ts": ts, "cache_hit": True, "stream": False, "tokens_in": 12, "ttft_s": 0.25,
            "decisions": {"route": {"model": "m", "reason": "name"}}, "ensemble_members": ["a", "b"],
        },
    )
    writer.write("requests", {"id": "r2", "ts": DAY1, "tokens_in": None})  # naive datetime = UTC
    writer.write("requests", {"id": "r3"}, ts=ts + 60)  # default ts from the caller
    writer.flush()
    rows = store.execute(
        "SELECT id, ts, cache_hit, stream, tokens_in, ttft_s, decisions, ensemble_members FROM requests ORDER BY id"
    ).fetchall()
    assert rows[0][:6] == ("r1", DAY1, True, False, 12, 0.25)
    assert json.loads(rows[0][6]) == {"route": {"model": "m", "reason": "name"}}
    assert json.loads(rows[0][7]) == ["a", "b"]
    assert rows[1][:5] == ("r2", DAY1, None, None, None)
    assert rows[2][1] == datetime(2026, 11, 1, 10, 1, 0)


def test_missing_ts_defaults_to_write_time(store):
    writer = store.writer()
    before = time.time()
    writer.write("engine_stats", {"replica": "r0"})
    writer.flush()
    (ts,) = store.execute("SELECT epoch(ts) FROM engine_stats").fetchone()
    assert before - 0.01 <= ts <= time.time() + 0.01


def test_unknown_table_raises_and_unknown_column_is_ignored(store, caplog):
    writer = store.writer()
    with pytest.raises(ValueError, match="unknown telemetry table 'bogus'"):
        writer.write("bogus", {})
    with pytest.raises(ValueError, match="unknown telemetry table"):
        writer.write("config_changes", {})  # low-rate tables go through sessions
    writer.write("requests", {"id": "a", "no_such_column": 1})
    writer.flush()
    assert _count(store) == 1
    assert "no column 'no_such_column'" in caplog.text


def test_a_bad_table_batch_does_not_lose_the_other_tables(store):
    writer = store.writer()
    writer.write("requests", {"id": "good"})
    writer.write("engine_stats", {"replica": "r0", "num_running": "not a number"})
    writer.flush()
    assert _count(store) == 1
    assert _count(store, "engine_stats") == 0
    assert writer.stats.num_dropped == 1
    assert "engine_stats" in writer.stats.last_error


def test_full_queue_drops_and_counts(store):
    writer = TelemetryWriter(store.connection, flush_interval_s=1.0, max_pending_rows=10)  # not started
    assert writer.write_many("requests", [{"id": str(i)} for i in range(10)]) is True
    assert writer.write("requests", {"id": "overflow"}) is False
    assert writer.stats.num_dropped == 1
    writer.close()
    assert _count(store) == 10


@pytest.mark.parametrize("interval", [0, -1, 1.5])
def test_flush_interval_must_be_at_most_one_second(store, interval):
    with pytest.raises(ValueError, match="flush_interval_s"):
        TelemetryWriter(store.connection, flush_interval_s=interval)


def test_writes_from_many_threads_all_land(store):
    writer = store.writer(flush_interval_s=0.05)

    def produce(k):
        for i in range(500):
            writer.write("expert_load", {"replica": "r", "layer": k, "expert": i % 8, "tokens": 1})

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.flush()
    assert store.execute("SELECT count(*), sum(tokens) FROM expert_load").fetchone() == (2000, 2000)


def test_normal_interpreter_exit_flushes_an_unclosed_writer(tmp_path):
    import subprocess
    import sys

    from tokenops.store import Store

    path = str(tmp_path / "exit.duckdb")
    code = (
        "import sys\nfrom tokenops.store import Store\n"
        "w = Store.open(sys.argv[1]).writer(flush_interval_s=1.0)\n"
        "w.write_many('requests', [{'id': str(i)} for i in range(500)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with Store.open(path, read_only=True) as store:
        assert _count(store) == 500
