"""`tokenops tune` next to a running `tokenops serve` with no --url and no admin key (the
server's store channel), --apply, and `tokenops serve --engine-profile` starting from the winner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import httpx
import pytest

from tokenops.testing_serve import ServeProcess

QUICK = ["--budget", "2", "--measure-seconds", "1.5", "--min-requests", "5", "--max-measurements", "2",
         "--start-rate", "2", "--input-len", "16", "--output-len", "4"]


def _tune(srv: ServeProcess, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TOKENOPS_STORE=str(srv.store_path))
    for name in ("TOKENOPS_ADMIN_KEY", "TOKENOPS_URL"):  # the channel needs neither
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "tokenops", "tune", *args], env=env, cwd=srv.workdir,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_tune_apply_and_serve_profile(tmp_path):
    with ServeProcess(tmp_path / "a") as srv:
        r = _tune(srv, "--slo", "p95=3s", "--only", "engine.max_num_seqs", "--param", "engine.max_num_seqs=32,4",
                  "--apply", "--profile-dir", str(tmp_path / "profiles"), "--json", *QUICK)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["space"] == {"engine.max_num_seqs": [32, 4]}
        # one model per replica and no cascade/router configured: those knobs cannot matter
        assert "routing.replica_policy" not in out["dropped"]  # not asked for with --only: not listed
        assert out["best"] is not None and out["profile"]
        winner = out["best"]["params"]["engine.max_num_seqs"]
        live = httpx.get(f"{srv.url}/admin/tunables", headers=srv.admin_headers).json()["tunables"]
        assert {t["name"]: t["value"] for t in live}["engine.max_num_seqs"] == winner  # --apply
        assert out["applied"] == {"engine.max_num_seqs": winner}

    import duckdb

    with duckdb.connect(str(srv.store_path), read_only=True) as con:
        changes = con.execute("SELECT name, old_value, new_value, actor FROM config_changes ORDER BY id").fetchall()
        trials = con.execute("SELECT count(*) FROM tune_trials").fetchone()[0]
    assert trials == len(out["trials"])  # saved through the server while it held the store
    assert all(old != new for _, old, new, _ in changes), changes  # no no-op audit rows

    profile = tomllib.loads(open(out["profile"]).read())
    assert profile["tune"]["model"] == "tokenops-demo" and profile["tune"]["slo"] == ["ttft_p95=3000ms"]
    assert "hardware" in profile["tune"]
    # start a server from a profile (the written one, with a batch budget changed to see it land)
    custom = tmp_path / "profiles" / "custom.toml"
    custom.write_text(open(out["profile"]).read().replace(f'"engine.max_num_seqs" = {winner}',
                                                          '"engine.max_num_seqs" = 6'))
    with ServeProcess(tmp_path / "b", args=["--engine-profile", str(custom)]) as srv2:
        live = httpx.get(f"{srv2.url}/admin/tunables", headers=srv2.admin_headers).json()["tunables"]
        assert {t["name"]: t["value"] for t in live}["engine.max_num_seqs"] == 6
        assert "profile custom" in srv2.log()


PROFILE = """[tune]
model = "some-other-model"
hardware = "x86_64-2cpu"
slo = ["ttft_p95=200ms"]

[tunables]
"engine.max_num_seqs" = 6
"engine.max_num_batched_tokens" = 256
"""


def test_serve_profile_and_why_the_space_is_empty(tmp_path):
    (tmp_path / "profiles" / "engines").mkdir(parents=True)
    (tmp_path / "profiles" / "engines" / "small-batch.toml").write_text(PROFILE)
    # [engine] profile in tokenops.toml (the slow test above uses --engine-profile); found under ./profiles/engines
    with ServeProcess(tmp_path, config='[engine]\nprofile = "small-batch"\n') as srv:
        live = httpx.get(f"{srv.url}/admin/tunables", headers=srv.admin_headers).json()["tunables"]
        values = {t["name"]: t["value"] for t in live}
        assert values["engine.max_num_seqs"] == 6 and values["engine.max_num_batched_tokens"] == 256
        assert "profile small-batch" in srv.log()
        assert "warning: engine profile small-batch was tuned for model some-other-model" in srv.log()
        empty = _tune(srv, "--slo", "p95=3s", "--only", "quantization.weights")
        assert empty.returncode == 2 and "quantization.weights needs a restart" in empty.stderr
        routing = _tune(srv, "--slo", "p95=3s", "--only", "routing")
        assert routing.returncode == 2 and "needs a model with 2+ replicas" in routing.stderr


def test_serve_refuses_an_unknown_profile(tmp_path):
    env = dict(os.environ, TOKENOPS_STORE=str(tmp_path / "s.duckdb"))
    r = subprocess.run([sys.executable, "-m", "tokenops", "serve", "--engine-profile", "nope"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no engine profile 'nope'" in r.stderr and "Traceback" not in r.stderr
    old = subprocess.run([sys.executable, "-m", "tokenops", "serve", "--profile", "nope"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert old.returncode == 2 and old.stderr.strip().splitlines() == [
        "error: serve --profile is now --engine-profile: tokenops serve --engine-profile nope"]
