"""Every store command works while `tokenops serve` holds the store, with the same
output as from the file once the server has stopped (the local store channel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import openai
import pytest

from tokenops.testing_serve import ServeProcess


class _Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _cli(srv: ServeProcess, *args: str) -> _Result:
    """The CLI in this process (not the server's): typer's CliRunner, the store given by --store's env var."""
    from typer.testing import CliRunner

    from tokenops.cli import build_app

    env = {"TOKENOPS_STORE": str(srv.store_path), "TOKENOPS_URL": None, "COLUMNS": "200"}
    result = CliRunner().invoke(build_app(), list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        from tokenops.cli import _known_errors

        if not isinstance(result.exception, _known_errors()):
            raise result.exception
        return _Result(2, result.stdout, f"error: {result.exception}")  # what main() prints
    return _Result(result.exit_code, result.stdout, result.stderr)


def _traffic(srv: ServeProcess) -> None:
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
    models = [m.id for m in client.models.list().data if m.id.startswith("tokenops-demo")]
    assert "tokenops-demo-moe" in models
    for model in models:  # the demo and the demo MoE (its expert load feeds `moe plan`)
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello there"}],
                                       max_tokens=4)


def test_report_moe_route_bench_while_serving(tmp_path):
    srv = ServeProcess(tmp_path)
    with srv:
        _traffic(srv)
        time.sleep(1.2)  # one telemetry flush
        report = _cli(srv, "report", "--json", "--since", "all")
        assert report.returncode == 0, report.stderr
        assert json.loads(report.stdout)["requests"] >= 2
        moe = _cli(srv, "moe", "plan", "--devices", "2", "--json")
        assert moe.returncode == 0, moe.stderr
        route = _cli(srv, "route", "calibrate", "--strong-share", "0.5", "--out", str(tmp_path / "thr.toml"))
        bench = _cli(srv, "bench", "-n", "3", "--rate", "inf", "--input-len", "16", "--output-len", "4", "--json")
        assert bench.returncode == 0, bench.stderr
        run_id = json.loads(bench.stdout)["id"]
        after = _cli(srv, "report", "--json", "--since", "all")
        runs = json.loads(after.stdout)["bench_runs"]
        assert run_id in [r[0] for r in runs["rows"]]  # a bench run made during serve lands in the store
        assert "in use by" not in bench.stderr + report.stderr + moe.stderr + route.stderr
        from tokenops.bench.replay import load_recorded

        assert len(load_recorded(str(srv.store_path), 100)) >= 2  # the replay workload reads it too
        # a second server on the same store is refused with the first one's address
        env = dict(os.environ, TOKENOPS_STORE=str(srv.store_path))
        second = subprocess.run([sys.executable, "-m", "tokenops", "serve", "--port", "1"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and f"already served by `tokenops serve` at {srv.url}" in second.stderr
        during = {"report": after.stdout, "moe": moe.stdout, "route": (route.returncode, route.stdout, route.stderr)}
    # the same commands on the file itself, now that the server is gone
    srv_path_free = _cli(srv, "report", "--json", "--since", "all")
    assert not (srv.store_path.parent / "tokenops.duckdb.sock").exists()
    assert srv_path_free.stdout == during["report"]
    assert _cli(srv, "moe", "plan", "--devices", "2", "--json").stdout == during["moe"]
    route = _cli(srv, "route", "calibrate", "--strong-share", "0.5", "--out", str(tmp_path / "thr.toml"))
    assert (route.returncode, route.stdout, route.stderr) == during["route"]


@pytest.mark.slow
def test_profile_writes_the_store_while_serving(tmp_path):
    with ServeProcess(tmp_path) as srv:
        result = _cli(srv, "profile", "run", "tokenops-demo", "--n", "3", "--url", srv.base_url,
                      "--out", str(tmp_path / "profiles"))
        assert result.returncode == 0, result.stderr
        rows = _cli(srv, "report", "--json")  # the server is still up: read the profile rows through it
        assert rows.returncode == 0
    from tokenops.store import Store

    with Store.open(srv.store_path, read_only=True) as store:
        dims = store.execute("SELECT count(*) FROM capability_profiles WHERE model = 'tokenops-demo'").fetchone()[0]
    assert dims >= 1

