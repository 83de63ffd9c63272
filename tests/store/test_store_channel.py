"""The server's local store channel, unit-tested in one process: a ``Store`` served
by a ``StoreChannel`` and read/written through a ``RemoteStore``."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import stat

import pytest

from tokenops.store import Store, StoreError, wire
from tokenops.store.channel import StoreChannel
from tokenops.store.table_models import BenchRun
from tokenops.store.remote import RemoteStore


@pytest.fixture
def served(tmp_path):
    store = Store.open(tmp_path / "store" / "s.duckdb")
    channel = StoreChannel(store).start()
    channel.publish(url="http://127.0.0.1:1")
    try:
        yield store, channel
    finally:
        channel.close()
        store.close()


def test_socket_is_private_and_removed_on_close(tmp_path):
    store = Store.open(tmp_path / "x.duckdb")
    channel = StoreChannel(store).start()
    path = channel.path
    assert path == wire.socket_path(store.path) and path.name == "x.duckdb.sock"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    channel.close()
    store.close()
    assert not path.exists()


def test_reads_match_the_file(served):
    store, _ = served
    w = store.writer()
    w.write_many("requests", [{"id": f"r{i}", "model_served": "m", "status": "ok", "tokens_in": i, "ttft_s": 0.1 * i}
                              for i in range(5)])
    w.flush()
    with RemoteStore(store.path, read_only=True) as remote:
        assert remote.server_info["url"] == "http://127.0.0.1:1"
        sql = "SELECT id, ts, tokens_in FROM requests WHERE tokens_in >= ? ORDER BY id"
        assert remote.execute(sql, [2]).fetchall() == store.execute(sql, [2]).fetchall()
        since = dt.datetime(2000, 1, 1)
        assert remote.run_query("usage_by_model_day", since=since) == store.run_query("usage_by_model_day", since=since)
        assert remote.execute("SELECT count(*) FROM requests").fetchone() == (5,)


def test_writes_only_through_add(served):
    store, _ = served
    with RemoteStore(store.path) as remote:
        remote.add(BenchRun(id="b1", ts=dt.datetime(2026, 1, 2, 3, 4, 5), target="t", workload="w", options="{}"))
        assert remote.record_config_change("engine.max_num_seqs", 8, 16, actor="me") > 0
        for sql in ("DELETE FROM requests", "SELECT 1; DELETE FROM requests", "COMMIT; DROP TABLE requests",
                    "CREATE TABLE x (a INT)"):
            with pytest.raises(StoreError, match="one SELECT"):
                remote.execute(sql)
    assert store.execute("SELECT id, ts FROM bench_runs").fetchall() == [("b1", dt.datetime(2026, 1, 2, 3, 4, 5))]
    assert store.execute("SELECT name, new_value, actor FROM config_changes").fetchall() == [
        ("engine.max_num_seqs", "16", "me")]


def test_read_only_client_cannot_add(served):
    store, _ = served
    with RemoteStore(store.path, read_only=True) as remote, pytest.raises(StoreError, match="read-only"):
        remote.add(BenchRun(id="b2", ts=dt.datetime(2026, 1, 1), target="t", workload="w"))


def test_other_users_are_refused(served, monkeypatch):
    store, channel = served
    monkeypatch.setattr("tokenops.store.channel.peer_uid", lambda sock: os.getuid() + 1)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(channel.path))  # the refusal comes at once, before any request (then the server hangs up)
        reply = json.loads(s.makefile("rb").readline())
    assert "refused" in reply["error"] and "result" not in reply


def test_a_socket_of_another_owner_is_not_trusted(tmp_path, monkeypatch):
    store = Store.open(tmp_path / "y.duckdb")
    channel = StoreChannel(store).start()
    try:
        someone_else = os.getuid() + 1
        monkeypatch.setattr(os, "getuid", lambda: someone_else)
        with pytest.raises(StoreError, match="not a socket of this user"):
            RemoteStore(store.path)
    finally:
        channel.close()
        store.close()


def test_long_store_paths_get_a_private_socket_folder(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "tokenops.duckdb"
    path = wire.socket_path(deep)
    assert len(str(path)) <= 100 and path.parent.name == f"tokenops-{os.getuid()}"
    assert path == wire.socket_path(deep)  # server and client agree


def test_wire_round_trip_keeps_types():
    from decimal import Decimal

    value = {"a": dt.datetime(2026, 1, 2, 3, 4, 5, 6), "b": dt.date(2026, 1, 2), "c": Decimal("1.5"), "d": [1, None]}
    assert wire.decode(wire.encode(value)) == value
