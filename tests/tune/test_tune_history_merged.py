"""``tokenops tune --workload replay --history-store a --history-store b``: the traffic the study
replays is every gateway replica's recorded requests read as one (tokenops/store/merged_telemetry.py),
in time order across the replicas; end to end against the fake server's live tunables."""

import datetime as dt
import tomllib

import pytest
from fake_server import FakeEngine, FakeServer
from typer.testing import CliRunner

from tokenops.bench.request import WorkloadError
from tokenops.bench.workloads import build_workload
from tokenops.cli import build_app
from tokenops.store import Store
from tokenops.store.table_models import RequestRow

T0 = dt.datetime(2026, 11, 2, 9, 0, 0)


def _seed(path, replica: str, offsets: list[float], tokens_in: int) -> None:
    with Store.open(str(path)) as store:
        store.add(*[RequestRow(id=f"{replica}{i}", ts=T0 + dt.timedelta(seconds=s), tokens_in=tokens_in + i,
                               tokens_out=4, status="ok") for i, s in enumerate(offsets)])


def test_replay_reads_every_replica_store_in_time_order(tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _seed(a, "a", [0, 2, 4], 10)  # replica A: 10, 11, 12 tokens at 0, 2, 4 s
    _seed(b, "b", [1, 3], 20)  # replica B: 20, 21 tokens at 1, 3 s
    reqs = build_workload("replay", 10, store=[str(a), str(b)])
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [r.num_prompt_tokens for r in reqs] == [10, 20, 11, 21, 12]
    assert len(build_workload("replay", 2, store=[str(a)])) == 2  # one store in a list: as before
    with pytest.raises(WorkloadError, match="no store at"):
        build_workload("replay", 2, store=[str(a), str(tmp_path / "gone.duckdb")])


def test_tune_replays_the_merged_history(tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _seed(a, "a", [i * 0.02 for i in range(0, 40, 2)], 12)
    _seed(b, "b", [i * 0.02 for i in range(1, 40, 2)], 12)
    engine = FakeEngine(base_s=0.01, per_token_s=0.0002, max_num_seqs=32)
    with FakeServer(engine) as s:
        r = CliRunner().invoke(build_app(), [
            "tune", "--url", s.url, "--admin-key", "test-admin", "--slo", "p95=2s", "--budget", "1",
            "--only", "engine.max_num_seqs", "--workload", "replay", "--history-store", str(a),
            "--history-store", str(b), "--store", str(tmp_path / "t.duckdb"), "--profile-dir",
            str(tmp_path / "profiles"), "--json", "--measure-seconds", "0.5", "--min-requests", "10",
            "--max-measurements", "2", "--start-rate", "20"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    import json

    out = json.loads(r.stdout)
    assert out["trials"] and out["trials"][0]["status"] == "complete"
    prof = tomllib.loads(open(out["profile"]).read())
    assert prof["tune"]["workload"] == "replay" and prof["tune"]["workload_store"] == [str(a), str(b)]


def test_history_store_needs_the_replay_workload(tmp_path):
    env = {"TOKENOPS_STORE": str(tmp_path / "none.duckdb")}  # no server of "this folder"
    r = CliRunner().invoke(build_app(), ["tune", "--slo", "p95=1s", "--launch", "--history-store", "a.duckdb"],
                           env=env)
    assert r.exit_code != 0 and "--history-store is read by --workload replay only" in str(r.output) + str(r.exception)
