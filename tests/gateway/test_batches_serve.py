"""OpenAI's Batch API against a real ``tokenops serve`` (the demo chat model: the gateway and the
runner are under test), driven by the openai SDK: upload, create, poll, download; bad lines named
at upload; tenants apart; cancel; expiry; a ``kill -9`` in the middle of a batch and a restart on
the same store; batch tokens priced at the discount and shown apart in /admin/requests and /metrics."""

from __future__ import annotations

import io
import json
import os
import signal
import time
import tomllib
from pathlib import Path

import httpx
import openai
import pytest
from tests.serve_configs import config as serve_config
from tests.serve_configs import local_model, section
from tokenops.engine.models.default_model import shipped_model_dir
from tokenops.testing_serve import ServeProcess

API_KEY, OTHER_KEY, ADMIN_KEY = "batch-api-key-1", "batch-other-key-1", "batch-admin-key-1"
MODEL = "demo"
ROOT = Path(__file__).resolve().parents[2]
PRICE_IN, PRICE_OUT = 1000.0, 2000.0  # USD per 1M tokens: large, so a batch line's cost is visible


def documented_batches() -> dict:
    """docs/batches.md's ``[batches]`` block, copied from the page (not retyped)."""
    from tests.test_docs_examples import blocks

    tables = [tomllib.loads(b.code) for b in blocks(ROOT / "docs" / "batches.md") if b.language == "toml"]
    return next(t["batches"] for t in tables if "batches" in t)


def _config(**batches) -> str:
    return serve_config(
        local_model(MODEL, shipped_model_dir(), cost_input_per_1m=PRICE_IN, cost_output_per_1m=PRICE_OUT),
        section("gateway", api_keys={API_KEY: "acme", OTHER_KEY: "globex"}, metrics_key="batch-metrics-key"),
        section("batches", **{**documented_batches(), **batches}),
    )


def _lines(n: int, max_tokens: int = 4, prefix: str = "req") -> list[dict]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Say {i}"}], "max_tokens": max_tokens},
        }
        for i in range(n)
    ]


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _submit(client: openai.OpenAI, lines: list[dict], window: str = "24h"):
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window=window)


def _wait(client: openai.OpenAI, batch_id: str, states: tuple[str, ...], timeout_s: float = 240.0, until=None):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in states or (until is not None and until(batch)):
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status}: {batch.request_counts}"
        time.sleep(0.2)


def _read(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("batches"), config=_config(), admin_key=ADMIN_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def other(served):
    return openai.OpenAI(base_url=served.base_url, api_key=OTHER_KEY, max_retries=0, timeout=60)


def test_upload_run_download_every_custom_id_once(served, client):
    lines = _lines(24)
    batch = _submit(client, lines)
    assert batch.status == "validating" and batch.request_counts.total == 24
    done = _wait(client, batch.id, ("completed", "failed", "expired", "cancelled"))
    assert done.status == "completed", done
    assert done.request_counts.completed == 24 and done.request_counts.failed == 0
    assert done.error_file_id is None and done.completed_at >= done.in_progress_at >= done.created_at
    out = _read(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(line["custom_id"] for line in lines)
    first = out[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"]["status_code"] == 200 and first["response"]["request_id"]
    assert first["response"]["body"]["object"] == "chat.completion"
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert batch.id in [b.id for b in client.batches.list(limit=100).data]


def test_batch_lines_are_priced_at_the_discount_and_shown_apart(served, client):
    done = _wait(client, _submit(client, _lines(3, prefix="priced")).id, ("completed",))
    rows = httpx.get(f"{served.url}/admin/requests?limit=200", headers=served.admin_headers, timeout=30).json()
    mine = [r for r in rows["requests"] if r.get("batch_id") == done.id]
    assert len(mine) == 3 and all(r["priority_class"] == "batch" for r in mine)
    for r in mine:
        full = (r["tokens_in"] * PRICE_IN + r["tokens_out"] * PRICE_OUT) / 1e6
        assert r["cost_usd"] == pytest.approx(documented_batches()["discount"] * full)
    interactive = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    rows = httpx.get(f"{served.url}/admin/requests?limit=5", headers=served.admin_headers, timeout=30).json()
    row = next(r for r in rows["requests"] if r["id"].split("-", 1)[-1] == interactive.id.split("-", 1)[-1])
    assert row["priority_class"] == "interactive" and row["batch_id"] is None
    assert row["cost_usd"] == pytest.approx((row["tokens_in"] * PRICE_IN + row["tokens_out"] * PRICE_OUT) / 1e6)
    metrics = httpx.get(f"{served.url}/metrics", headers={"Authorization": "Bearer batch-metrics-key"}, timeout=30).text
    completed = next(
        line for line in metrics.splitlines() if line.startswith('tokenops:batch_lines_total{status="completed"}')
    )
    assert int(completed.split()[-1]) >= 3
    tokens = next(line for line in metrics.splitlines() if line.startswith("tokenops:batch_tokens_total"))
    assert int(tokens.split()[-1]) > 0


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("not json", "line 3: We could not parse"),
        (
            {
                "custom_id": "req-0",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": []},
            },
            "line 3: custom_id 'req-0' is already used on line 1",
        ),
        ({"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {}}, "line 3: method"),
        ({"custom_id": "x", "method": "POST", "url": "/v1/images/generations", "body": {}}, "line 3: url"),
        (
            {
                "custom_id": "x",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "nope", "messages": []},
            },
            "line 3: body.model 'nope' is not served",
        ),
        (
            {
                "custom_id": "x",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": "hi"},
            },
            "line 3: body.messages",
        ),
        (
            {
                "custom_id": "x",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True},
            },
            "line 3: body.stream",
        ),
    ],
)
def test_a_bad_line_is_named_by_number_at_upload(client, bad, says):
    raw = _jsonl(_lines(2)) + (bad.encode() + b"\n" if isinstance(bad, str) else _jsonl([bad]))
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("bad.jsonl", io.BytesIO(raw)), purpose="batch")
    assert says in e.value.message
    assert e.value.body["param"] == "file"


def test_upload_and_create_refusals_name_the_field(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("x.jsonl", io.BytesIO(_jsonl(_lines(1)))), purpose="fine-tune")
    assert e.value.body["param"] == "purpose"
    uploaded = client.files.create(file=("x.jsonl", io.BytesIO(_jsonl(_lines(1)))), purpose="batch")
    for kwargs, param in (
        ({"completion_window": "1d"}, "completion_window"),
        ({"endpoint": "/v1/images/generations"}, "endpoint"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
    ):
        args = {"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **kwargs}
        with pytest.raises(openai.BadRequestError) as e:
            client.batches.create(**args)
        assert e.value.body["param"] == param, e.value.body
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h")


def test_another_tenant_gets_404_on_files_and_batches(client, other):
    batch = _submit(client, _lines(2, prefix="mine"))
    for call in (
        lambda: other.files.retrieve(batch.input_file_id),
        lambda: other.files.content(batch.input_file_id),
        lambda: other.files.delete(batch.input_file_id),
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in other.batches.list().data]
    assert batch.input_file_id not in [f.id for f in other.files.list().data]
    done = _wait(client, batch.id, ("completed",))
    with pytest.raises(openai.NotFoundError):
        other.files.content(done.output_file_id)


def test_a_batch_whose_lines_name_another_endpoint_fails_naming_them(client):
    lines = _lines(3, prefix="mixed")
    lines[1] = {**lines[1], "url": "/v1/completions", "body": {"model": MODEL, "prompt": "x", "max_tokens": 2}}
    done = _wait(client, _submit(client, lines).id, ("failed", "completed"))
    assert done.status == "failed" and done.failed_at is not None
    assert [(e.line, e.code) for e in done.errors.data] == [(2, "invalid_url")]


def test_cancel_stops_within_a_second(client):
    batch = _submit(client, _lines(300, max_tokens=48, prefix="cancel"))
    _wait(client, batch.id, (), until=lambda b: b.request_counts.completed >= 2)
    t0 = time.monotonic()
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = _wait(client, batch.id, ("cancelled",), timeout_s=30)
    took = time.monotonic() - t0
    assert took < 1.0 or done.cancelled_at - done.cancelling_at <= 1, f"cancel took {took:.2f} s"
    print(f"cancel -> cancelled seen by the client after {took:.2f} s")
    out = _read(client, done.output_file_id)
    assert 2 <= len(out) < 300 and len({line["custom_id"] for line in out}) == len(out)
    time.sleep(1.0)  # nothing is written after the cancel
    assert len(_read(client, done.output_file_id)) == len(out)
    assert client.batches.retrieve(batch.id).request_counts.completed == len(out)


def test_a_short_window_expires_and_names_the_lines_that_did_not_run(client):
    lines = _lines(300, max_tokens=48, prefix="expire")
    done = _wait(client, _submit(client, lines, window="2s").id, ("expired", "completed"), timeout_s=60)
    assert done.status == "expired" and done.expired_at - done.created_at <= 5
    out, errors = _read(client, done.output_file_id), _read(client, done.error_file_id)
    assert errors and all(e["error"]["code"] == "batch_expired" and e["response"] is None for e in errors)
    ids = [line["custom_id"] for line in out + errors]
    assert sorted(ids) == sorted(line["custom_id"] for line in lines)  # each exactly once


@pytest.mark.slow  # two serve starts and 300 lines: ~45 s; tests/gateway/test_batches_recovery.py is the fast check
def test_kill_9_mid_batch_resumes_after_restart_without_repeats(tmp_path):
    lines = _lines(300, max_tokens=8, prefix="kill")
    srv = ServeProcess(tmp_path, config=_config(max_in_flight=4), admin_key=ADMIN_KEY).start()
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key=API_KEY, max_retries=0, timeout=60)
        batch = _submit(client, lines)
        _wait(client, batch.id, (), until=lambda b: b.request_counts.completed >= 20)
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait()
    finally:
        srv.stop()
    with ServeProcess(tmp_path, config=_config(max_in_flight=8), admin_key=ADMIN_KEY) as again:
        client = openai.OpenAI(base_url=again.base_url, api_key=API_KEY, max_retries=0, timeout=60)
        done = _wait(client, batch.id, ("completed", "failed"))
        assert done.status == "completed" and done.request_counts.completed == 300
        out = _read(client, done.output_file_id)
        ids = [line["custom_id"] for line in out]
        assert len(ids) == len(set(ids)) == 300
        assert set(ids) == {line["custom_id"] for line in lines}


def test_cli_submits_waits_and_downloads(served, tmp_path):
    from tokenops.cli import build_app
    from typer.testing import CliRunner

    source = tmp_path / "in.jsonl"
    source.write_bytes(_jsonl(_lines(5, prefix="cli")))
    common = ["--url", served.url, "--api-key", API_KEY]
    runner = CliRunner()
    result = runner.invoke(
        build_app(), ["batch", "submit", str(source), "--wait", "--timeout", "240", "--json", *common]
    )
    assert result.exit_code == 0, result.output
    batch = json.loads(result.output)
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    out = tmp_path / "out.jsonl"
    result = runner.invoke(build_app(), ["batch", "download", batch["id"], "-o", str(out), *common])
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(line)["custom_id"] for line in out.read_text().splitlines()) == [
        f"cli-{i}" for i in range(5)
    ]
    result = runner.invoke(build_app(), ["batch", "status", "batch_nope", *common])
    assert result.exit_code != 0 and "404" in str(result.exception or result.output)


@pytest.mark.slow
def test_a_2000_line_batch_from_upload_to_download(client):
    lines = _lines(2000, max_tokens=4, prefix="big")
    t0 = time.monotonic()
    done = _wait(client, _submit(client, lines).id, ("completed", "failed"), timeout_s=1200)
    took = time.monotonic() - t0
    assert done.status == "completed" and done.request_counts.completed == 2000, done
    ids = [line["custom_id"] for line in _read(client, done.output_file_id)]
    assert len(ids) == len(set(ids)) == 2000 and set(ids) == {line["custom_id"] for line in lines}
    print(f"2000 lines (max_tokens 4, demo model) in {took:.1f} s: {2000 / took:.1f} lines/s")


@pytest.mark.slow
def test_a_batch_on_the_default_model(tmp_path):
    from tests.real_model import MODEL as REAL
    from tests.real_model import SERVE_ENV

    lines = [
        {"custom_id": f"real-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": REAL, "messages": [{"role": "user", "content": f"What is {i} plus {i}?"}], "max_tokens": 16}}
        for i in range(6)
    ]  # fmt: skip
    with ServeProcess(tmp_path, env=SERVE_ENV, admin_key=ADMIN_KEY) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
        done = _wait(client, _submit(client, lines).id, ("completed", "failed"), timeout_s=600)
        assert done.status == "completed" and done.request_counts.completed == 6
        out = _read(client, done.output_file_id)
        assert sorted(line["custom_id"] for line in out) == sorted(line["custom_id"] for line in lines)
        assert all(line["response"]["body"]["choices"][0]["message"]["content"] for line in out)


def test_lists_page_with_after_as_the_sdk_walks_them(client):
    for _ in range(3):
        _submit(client, _lines(1, prefix="page"))
    whole = [b.id for b in client.batches.list(limit=100).data]
    walked = [b.id for b in client.batches.list(limit=2)]  # the SDK follows `after` page by page
    assert len(whole) >= 3 and walked == whole  # newest first, no repeats, none left out
    files = [f.id for f in client.files.list(purpose="batch").data]
    assert len(files) == len(set(files)) >= 3
    oldest_first = [f.id for f in client.files.list(purpose="batch", order="asc").data]
    assert oldest_first == files[::-1]


@pytest.mark.parametrize(
    ("endpoint", "body", "kind"),
    [
        ("/v1/completions", {"prompt": "Once upon", "max_tokens": 4}, "text_completion"),
        ("/v1/responses", {"input": "Say hi", "max_output_tokens": 4}, "response"),
    ],
)
def test_every_endpoint_runs_as_its_route_would(client, endpoint, body, kind):
    lines = [
        {"custom_id": f"{kind}-{i}", "method": "POST", "url": endpoint, "body": {"model": MODEL, **body}}
        for i in range(3)
    ]
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")
    done = _wait(client, batch.id, ("completed", "failed"))
    assert done.status == "completed" and done.request_counts.completed == 3, done
    out = _read(client, done.output_file_id)
    assert {line["response"]["body"]["object"] for line in out} == {kind}


def test_a_line_its_route_refuses_goes_to_the_error_file(client):
    # the demo chat model serves no embeddings: each line is the 400 the route would answer
    lines = [
        {"custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "x"}}
        for i in range(2)
    ]
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    done = _wait(client, batch.id, ("completed", "failed"))
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (0, 2)
    assert done.output_file_id is None
    errors = _read(client, done.error_file_id)
    assert sorted(e["custom_id"] for e in errors) == ["emb-0", "emb-1"]
    for e in errors:
        assert (
            e["response"]["status_code"] == 400 and e["response"]["body"]["error"]["message"] == e["error"]["message"]
        )
