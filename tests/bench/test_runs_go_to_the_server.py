"""`bench --url` against a tokenops server of another folder saves the run in *that* server's
store (through its admin API), so `tokenops report` next to the server lists it; the output
says where the run went, also when it could not go there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tokenops.testing_serve import ServeProcess

QUICK = ["-n", "3", "--concurrency", "1", "--input-len", "8", "--output-len", "2", "--json"]


def _cli(cwd, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TOKENOPS_STORE", "TOKENOPS_ADMIN_KEY", "TOKENOPS_URL")}
    return subprocess.run([sys.executable, "-m", "tokenops", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_bench_url_run_appears_in_that_servers_report(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    key_file = elsewhere / "server.key"
    with ServeProcess(tmp_path / "server") as srv:
        key_file.write_text(srv.admin_key + "\n")
        r = _cli(elsewhere, "bench", "--url", srv.base_url, "--admin-key-file", str(key_file), *QUICK)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["saved"] == f"saved to the store of the server at {srv.url} (bench_runs id {out['id']})"
        assert not (elsewhere / "store").exists()  # nothing left behind here

        report = _cli(srv.workdir, "report", "--json")  # next to the server: through its store socket
        assert report.returncode == 0, report.stderr
        assert out["id"] in json.dumps(json.loads(report.stdout)["bench_runs"])

        # without the key the run stays here, and the output says so
        r = _cli(elsewhere, "bench", "--url", srv.base_url, *QUICK)
        assert r.returncode == 0, r.stderr
        saved = json.loads(r.stdout)["saved"]
        assert saved.startswith("saved to store/tokenops.duckdb (not the store of") and "--admin-key-file" in saved
