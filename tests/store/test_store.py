"""Opening modes, the lock error, and low-rate entities through SQLModel sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from sqlmodel import select

from tokenops.store import Store, StoreError
from tokenops.store.table_models import BenchResult, BenchRun, CapabilityProfile, ConfigChange, TuneTrial

from store_helpers import DAY1

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from tokenops.store import Store
    store = Store.open(sys.argv[1])
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.fixture(scope="module")
def held_store(tmp_path_factory):
    """A store file held read-write by another process (like a running server)."""
    path = str(tmp_path_factory.mktemp("held") / "held.duckdb")
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield path, proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_read_only_store_reads_but_refuses_writes(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.record_config_change("max_num_seqs", 32, 64)
    with Store.open(path, read_only=True) as ro, Store.open(path, read_only=True) as ro2:
        assert ro.is_read_only
        assert ro.run_query("config_changes")["rows"][0][2] == "max_num_seqs"
        assert ro2.execute("SELECT count(*) FROM config_changes").fetchone() == (1,)
        with pytest.raises(StoreError, match="read-only"):
            ro.writer()
        with pytest.raises(Exception, match="read-only"):
            ro.execute("INSERT INTO requests (id) VALUES ('x')")


def test_read_only_open_of_a_missing_file_says_so(tmp_path):
    with pytest.raises(StoreError, match="no store at .*missing.duckdb"):
        Store.open(tmp_path / "missing.duckdb", read_only=True)
    assert not (tmp_path / "missing.duckdb").exists()


def test_file_held_by_another_process_gives_one_clear_line(held_store):
    path, pid = held_store
    for read_only in (False, True):
        with pytest.raises(StoreError) as info:
            Store.open(path, read_only=read_only)
        message = str(info.value)
        assert message.startswith(f"{path} is in use by another process (PID {pid}")
        assert "tokenops serve" in message and "admin API" in message
        assert "\n" not in message


def test_cli_main_prints_the_store_error_as_one_line(held_store):
    path, _ = held_store
    out = subprocess.run(
        [sys.executable, "-c", "from tokenops.cli import main; main()", "report", "--store", path],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TOKENOPS_DEBUG": "", "TOKENOPS_LOAD_PLUGINS": ""},
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "is in use by another process" in lines[0] and "/admin/query" in lines[0]


def test_same_process_second_open_with_other_mode_is_explained(store):
    with pytest.raises(StoreError, match="already open in this process"):
        Store.open(store.path, read_only=True)


def test_config_changes_get_increasing_ids_from_the_sequence(store):
    ids = [store.record_config_change("max_num_seqs", i, i + 1, actor="admin", source="admin-api") for i in range(3)]
    assert ids == [1, 2, 3]
    with store.session() as s:
        rows = s.exec(select(ConfigChange).order_by(ConfigChange.id)).all()
    assert [json.loads(r.new_value) for r in rows] == [1, 2, 3]
    assert rows[0].actor == "admin" and rows[0].ts is not None


def test_capability_profiles_upsert_by_natural_key(store):
    store.add(CapabilityProfile(model="m", dimension="math", score=0.4, n=10, updated_at=DAY1, source="profile"))
    store.add(CapabilityProfile(model="m", dimension="math", score=0.6, ci_low=0.5, ci_high=0.7, n=20))
    store.add(CapabilityProfile(model="m", dimension="code", score=0.3))
    with store.session() as s:
        rows = s.exec(select(CapabilityProfile).order_by(CapabilityProfile.dimension)).all()
    assert [(r.dimension, r.score, r.n) for r in rows] == [("code", 0.3, None), ("math", 0.6, 20)]


def test_bench_and_tune_entities_round_trip(store):
    store.add(BenchRun(id="run-1", ts=DAY1, target="http://x", workload="sharegpt", options=json.dumps({"n": 10})))
    store.add(
        BenchResult(run_id="run-1", step=0, mode="poisson", rate=2.0, num_requests=10, ttft_p95=0.2, goodput_rps=1.5),
        BenchResult(run_id="run-1", step=1, mode="poisson", rate=4.0, num_requests=20, ttft_p95=0.4, goodput_rps=2.5),
        TuneTrial(id="t-1", ts=DAY1, study="s", trial=0, params='{"max_num_seqs": 8}', goodput=2.5, is_best=True),
    )
    result = store.run_query("bench_results", run_id="run-1")
    ix = {c: i for i, c in enumerate(result["columns"])}
    assert [(r[ix["step"]], r[ix["rate"]], r[ix["goodput_rps"]]) for r in result["rows"]] == [(0, 2.0, 1.5), (1, 4.0, 2.5)]
    trials = store.run_query("tune_trials", study="s")
    assert trials["rows"][0][:4] == ["t-1", DAY1.isoformat(), "s", 0]


def test_failed_session_rolls_back(store):
    with pytest.raises(RuntimeError):
        with store.session() as s:
            s.add(CapabilityProfile(model="m", dimension="d", score=1.0))
            s.flush()
            raise RuntimeError("abort")
    assert store.execute("SELECT count(*) FROM capability_profiles").fetchone() == (0,)
