"""`tokenops profile run/compare/show` against a real HTTP server answering like a model with known skills."""

import json
import re
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI
from typer.testing import CliRunner

from tokenops.cli import build_app
from tokenops_plugins.multi_model._suites import DIMENSIONS, make_suite


def _oracle_answers():
    """prompt -> reference answer, for the tasks the CLI will generate (n=4, seed 0)."""
    return {t.prompt: t for d in DIMENSIONS for t in make_suite(d, 4, 0)}


def make_server(good_at: set[str]) -> FastAPI:
    app = FastAPI()
    tasks = _oracle_answers()

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        task = tasks[body["messages"][0]["content"]]
        text = task.reference if task.dimension in good_at else "no idea"
        return {"id": "x", "object": "chat.completion", "model": body["model"], "created": 0,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    return app


@pytest.fixture
def server():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    cfg = uvicorn.Config(make_server({"math", "classification"}), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(cfg)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1"
    srv.should_exit = True
    t.join(5)


def test_profile_writes_toml_results_and_store(server, tmp_path):
    store = tmp_path / "s.duckdb"
    args = ["profile", "run", "small", "--url", server, "--n", "4", "--out", str(tmp_path / "profiles"), "--store", str(store),
            "--cost-in", "0.15", "--cost-out", "0.6", "--json"]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    prof = json.loads(result.output.strip().splitlines()[-1])
    dims = prof["dimensions"]
    assert dims["math"]["score"] == 1.0 and dims["classification"]["score"] == 1.0
    assert dims["code"]["score"] == 0.0 and dims["code"]["n"] == 4
    assert dims["math"]["ci_low"] < 1.0  # Wilson interval on 4 tasks is wide
    assert (tmp_path / "profiles" / "small.toml").is_file()
    rows = (tmp_path / "profiles" / "small.results.jsonl").read_text().splitlines()
    assert len(rows) == 4 * len(DIMENSIONS)

    from tokenops.store import Store

    with Store.open(store, read_only=True) as s:
        got = dict(s.execute("SELECT dimension, score FROM capability_profiles WHERE model = 'small'").fetchall())
    assert got["math"] == 1.0 and got["code"] == 0.0

    # compare against a second profile
    big = dict(prof, model="big", dimensions={d: dict(v, score=1.0, ci_low=0.9, ci_high=1.0) for d, v in dims.items()})
    from tokenops_plugins.multi_model._profiles import save_profile

    save_profile(big, tmp_path / "profiles")
    result = CliRunner().invoke(build_app(), ["profile", "compare", "small", "big", "--dir", str(tmp_path / "profiles"), "--json"])
    assert result.exit_code == 0, result.output
    verdict = {r["dimension"]: r["better"] for r in json.loads(result.output)}
    assert verdict["code"] == "big"
    result = CliRunner().invoke(build_app(), ["profile", "show", "big", "--dir", str(tmp_path / "profiles"), "--json"])
    assert result.exit_code == 0, result.output
    assert [p["model"] for p in json.loads(result.output)] == ["big"]
    result = CliRunner().invoke(build_app(), ["profile", "show", "--dir", str(tmp_path / "profiles")])
    assert result.exit_code == 0 and "capability profile: small" in result.output and "capability profile: big" in result.output


def test_profile_unknown_suite_and_dead_server(tmp_path):
    r = CliRunner().invoke(build_app(), ["profile", "run", "m", "--suite", "poetry"])
    assert r.exit_code != 0 and "unknown suite(s) poetry" in str(r.exception)
    r = CliRunner().invoke(build_app(), ["profile", "run", "m", "--url", "http://127.0.0.1:9/v1", "--n", "1", "--suite", "math", "--no-store",
                                         "--out", str(tmp_path)])
    assert r.exit_code != 0 and "every request failed" in str(r.exception or r.output)


def test_one_meaning_per_word(tmp_path, capsys):
    """A model may be called "compare"; the old `tokenops profile MODEL` names the new spelling."""
    from tokenops.cli import main

    r = CliRunner().invoke(build_app(), ["profile", "run", "compare", "--url", "http://127.0.0.1:9/v1", "--n", "1",
                                         "--suite", "math", "--no-store", "--out", str(tmp_path)])
    assert "is http://127.0.0.1:9/v1 serving 'compare'?" in str(r.exception)
    r = CliRunner().invoke(build_app(), ["profile", "show", "nope", "--dir", str(tmp_path)])
    assert "no profile for nope" in str(r.exception) and "tokenops profile run MODEL" in str(r.exception)
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", "small", "--n", "3"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: `tokenops profile small`: profiling a model is now `tokenops profile run small` "
        "(subcommands: run, compare, show)"]
