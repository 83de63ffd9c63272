"""``tokenops tune`` end to end against the fake server's live tunables (small budget)."""

import json
import tomllib

import duckdb
import pytest
from fake_server import FakeEngine, FakeServer
from typer.testing import CliRunner

from tokenops.cli import build_app

FAST = ["--input-len", "16", "--output-len", "8", "--measure-seconds", "0.5", "--min-requests", "10",
        "--max-measurements", "3", "--start-rate", "20"]


def test_tune_against_live_tunables_writes_profile_and_trials(tmp_path):
    # 20 ms a step: one slot serves at most ~6 req/s (8 steps a request), under the 20 req/s the search
    # starts at, so max_num_seqs=1 fails the SLO at the default's goodput however slow the box; 32 slots
    # serve a request in ~0.21 s, far inside p95=600ms. (At 4 ms a step one slot made ~27 req/s, and on a
    # loaded box the default's measured goodput fell below that: a fresh-clone CI run, 2026-11-27.)
    engine = FakeEngine(base_s=0.02, per_token_s=0.0002, max_num_seqs=32)
    store = str(tmp_path / "t.duckdb")
    with FakeServer(engine) as s:
        r = CliRunner().invoke(build_app(), [
            "tune", "--url", s.url, "--admin-key", "test-admin", "--slo", "p95=600ms", "--slo", "tpot_p95=100ms",
            "--budget", "3", "--only", "engine.max_num_seqs", "--param", "engine.max_num_seqs=1,32",
            "--store", store, "--profile-dir", str(tmp_path / "profiles"), "--json", *FAST], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        # the server's values are restored after the study (no --apply)
        assert engine.max_num_seqs == 32
    out = json.loads(r.stdout)
    assert out["space"] == {"engine.max_num_seqs": [1, 32]}
    trials = out["trials"]
    assert len(trials) == 2  # the space holds two configurations
    assert trials[0]["params"] == {"engine.max_num_seqs": 32} and trials[0]["status"] == "complete"
    assert trials[0]["goodput"] > 0 and trials[0]["points"]
    # one slot at a time cannot sustain the default's goodput: measured once there, then stopped
    assert trials[1]["params"] == {"engine.max_num_seqs": 1} and trials[1]["status"] == "pruned"
    assert len(trials[1]["points"]) == 1 and trials[1]["points"][0]["rate"] == trials[0]["goodput"]
    assert out["best"]["trial"] == 0 and out["ratio"] == 1.0
    prof = tomllib.loads(open(out["profile"]).read())
    assert prof["tunables"] == {"engine.max_num_seqs": 32}
    assert prof["tune"]["goodput_rps"] == round(trials[0]["goodput"], 4) and prof["tune"]["model"] == "fake-model"
    con = duckdb.connect(store, read_only=True)
    rows = con.execute("select trial, status, is_best, goodput from tune_trials order by trial").fetchall()
    con.close()
    assert [(t, st, b) for t, st, b, _ in rows] == [(0, "complete", True), (1, "pruned", False)]


def test_tune_apply_pushes_the_winner(tmp_path):
    engine = FakeEngine(base_s=0.004, per_token_s=0.0002, max_num_seqs=1)
    with FakeServer(engine) as s:
        r = CliRunner().invoke(build_app(), [
            "tune", "--url", s.url, "--admin-key", "test-admin", "--slo", "p95=250ms", "--budget", "2",
            "--only", "engine.max_num_seqs", "--param", "engine.max_num_seqs=32,8", "--apply", "--no-store",
            "--profile-dir", str(tmp_path), *FAST], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert "winner (trial" in r.stdout and "applied to" in r.stdout
        # the registry default (32) is trial 0; whichever won is now live on the server
        winner = int(r.stdout.split("applied to")[1].split("engine.max_num_seqs': ")[1].split("}")[0])
        assert engine.max_num_seqs == winner in (32, 8)


def test_tune_user_errors(tmp_path):
    runner = CliRunner()
    env = {"TOKENOPS_STORE": str(tmp_path / "none.duckdb")}  # no server of "this folder"
    r = runner.invoke(build_app(), ["tune", "--slo", "p95=1s", "--url", "http://127.0.0.1:9", "--launch"], env=env)
    assert r.exit_code != 0
    r = runner.invoke(build_app(), ["tune", "--slo", "p95=1s", "--launch", "--apply"], env=env)
    assert r.exit_code != 0 and "needs a running server" in str(r.exception)


# 18 s; the other tests here run tune end to end in the default run
@pytest.mark.slow
def test_tune_finds_a_better_non_default_and_validates_it(tmp_path):
    # prefix caching (on by default) costs 60 ms a step here and 4 slots bind, so turning it off must win:
    # capacity about 4 / (8 tokens * 64 ms) = 8 req/s against about 100 req/s
    engine = FakeEngine(base_s=0.004, per_token_s=0.0001, max_num_seqs=4, prefix_caching_cost_s=0.06)
    with FakeServer(engine) as s:
        r = CliRunner().invoke(build_app(), [
            "tune", "--url", s.url, "--admin-key", "test-admin", "--slo", "p95=400ms", "--budget", "2",
            "--only", "engine.enable_prefix_caching", "--validate", "--no-store", "--profile-dir", str(tmp_path),
            "--json", "--input-len", "16", "--output-len", "8", "--measure-seconds", "0.5", "--min-requests", "10",
            "--max-measurements", "3", "--start-rate", "5"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert engine.enable_prefix_caching is True  # restored
    out = json.loads(r.stdout)
    assert out["trials"][0]["params"] == {"engine.enable_prefix_caching": True}
    assert out["best"]["params"] == {"engine.enable_prefix_caching": False}
    assert out["ratio"] > 1.3
    names = [(v["name"], v["met"]) for v in out["validation"]]
    assert names == [("default", False), ("winner", True)]
    assert all(v["rate"] == out["best"]["goodput"] for v in out["validation"])
