"""`tokenops tune --launch` against the real bundled engine (slow: launches `tokenops serve`)."""

import json
import tomllib

import pytest
from typer.testing import CliRunner

from tokenops.cli import build_app


@pytest.mark.slow
def test_tune_launches_the_bundled_engine(tmp_path):
    r = CliRunner().invoke(build_app(), [
        "tune", "--launch", "--slo", "p95=20s", "--budget", "2", "--only", "engine.max_num_seqs",
        "--param", "engine.max_num_seqs=2,32", "--input-len", "16", "--output-len", "4", "--measure-seconds", "2",
        "--min-requests", "6", "--max-measurements", "2", "--start-rate", "0.5", "--no-store",
        "--profile-dir", str(tmp_path), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["model"].startswith("tokenops")  # the embedded demo model, whichever ships
    assert out["trials"][0]["params"] == {"engine.max_num_seqs": 32}
    assert out["trials"][0]["status"] == "complete" and out["trials"][0]["goodput"] >= 0.5
    assert len(out["trials"]) == 2
    prof = tomllib.loads(open(out["profile"]).read())
    assert prof["tunables"]["engine.max_num_seqs"] in (2, 32)
