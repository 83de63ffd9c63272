"""Files and batches behind the shared-state seam (issue 55 with issue 54): two real ``tokenops
serve`` processes with the same ``[shared] postgres_url`` (the block of docs/scale-out.md, pointed at
a throwaway PostgreSQL from Debian's package), driven by the openai SDK: a file uploaded on A is
read on B, a batch created on A is visible on B, runs on one of them only (every line once in its
output, which both serve), and a batch created on A is cancelled through B within seconds.
Each gateway keeps its own DuckDB store (its own work folder): only PostgreSQL is shared."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from tests.gateway.test_shared_chains_serve import _shared_block
from tokenops.testing_postgres import PostgresUnavailable, postgres_server
from tokenops.testing_serve import ServeProcess

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tokenops" / "demo_models" / "target"


def _config(url: str) -> str:
    return (
        '[gateway]\napi_keys = { "key-a" = "team-a", "key-b" = "team-b" }\n\n'
        f'[[models]]\nname = "demo"\npath = "{DEMO}"\n\n[batches]\nmax_in_flight = 2\n\n' + _shared_block(url)
    )


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(postgres_server())
        except PostgresUnavailable as e:
            pytest.skip(str(e))
        config = _config(url)
        a = stack.enter_context(ServeProcess(tmp_path_factory.mktemp("batch_gw_a"), config=config))
        b = stack.enter_context(ServeProcess(tmp_path_factory.mktemp("batch_gw_b"), config=config))
        yield a, b


def _client(srv: ServeProcess, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, timeout=120)


def _jsonl(n: int, prefix: str, max_tokens: int = 4) -> bytes:
    lines = [
        {"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "demo", "messages": [{"role": "user", "content": f"Say {i}"}], "max_tokens": max_tokens}}
        for i in range(n)
    ]  # fmt: skip
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _until(predicate, what: str, timeout_s: float = 180.0):
    deadline = time.monotonic() + timeout_s
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def test_a_batch_created_on_a_runs_once_and_is_seen_on_b(gateways):
    a, b = (_client(s) for s in gateways)
    data = _jsonl(12, "req")
    uploaded = a.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert b.files.retrieve(uploaded.id).bytes == len(data)
    assert b.files.content(uploaded.id).content == data  # B had no copy of the bytes: it fetched them
    batch = a.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert b.batches.retrieve(batch.id).input_file_id == uploaded.id
    assert batch.id in [x.id for x in b.batches.list().data]
    with pytest.raises(openai.NotFoundError):  # another tenant, on either gateway
        _client(gateways[1], "key-b").batches.retrieve(batch.id)

    done = _until(lambda: (x := b.batches.retrieve(batch.id)).status == "completed" and x, "the batch to complete")
    assert done.request_counts.completed == 12 and done.request_counts.failed == 0
    for client in (a, b):
        out = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
        assert sorted(line["custom_id"] for line in out) == sorted(f"req-{i}" for i in range(12))  # each once
    ran = [  # the lines each gateway's pipeline ran: one gateway claimed the batch, the other ran none
        sum(1 for r in httpx.get(f"{s.url}/admin/requests?limit=500", headers=s.admin_headers, timeout=30)
            .json()["requests"] if r.get("batch_id") == batch.id)
        for s in gateways
    ]  # fmt: skip
    assert sorted(ran) == [0, 12], ran


@pytest.mark.slow  # 2,000 lines started, then cancelled: the first test is the fast check of the seam
def test_a_batch_created_on_a_is_cancelled_through_b(gateways):
    a, b = (_client(s) for s in gateways)
    uploaded = a.files.create(file=("long.jsonl", io.BytesIO(_jsonl(2000, "long", 16))), purpose="batch")
    batch = a.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    _until(lambda: b.batches.retrieve(batch.id).request_counts.completed > 0, "lines to finish")
    assert b.batches.cancel(batch.id).status == "cancelling"
    start = time.monotonic()
    done = _until(lambda: (x := a.batches.retrieve(batch.id)).status == "cancelled" and x, "the cancel", 30)
    assert time.monotonic() - start < 10  # the replica running it reads the cancel within a second or two
    assert done.request_counts.completed < 2000
    counts = done.request_counts.completed
    time.sleep(2)
    assert b.batches.retrieve(batch.id).request_counts.completed == counts  # nothing ran after the cancel


def _batch_requests(srv: ServeProcess, batch_id: str) -> list[str]:
    """The ids of the requests this gateway's pipeline ran for ``batch_id``'s lines."""
    rows = httpx.get(f"{srv.url}/admin/requests?limit=500", headers=srv.admin_headers, timeout=30).json()["requests"]
    return [r["id"] for r in rows if r.get("batch_id") == batch_id]


def _saved_lines(url: str, batch_id: str) -> int:
    """Finished lines the runner saved to PostgreSQL for a takeover (dropped once the batch is done)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as con:
            found = con.execute(
                sa.text("SELECT count(*) FROM batch_line_results WHERE batch_id = :b"), {"b": batch_id}
            ).scalar()
        return int(found or 0)
    finally:
        engine.dispose()


@pytest.mark.slow  # a claim lapses after 30 s: the takeover takes that long by design
def test_a_batch_whose_gateway_is_killed_is_finished_by_the_other_without_rerunning_a_line(tmp_path):
    """kill -9 of the gateway running a batch: the other takes it up once the claim lapses and
    finishes it, every line once in the output; the lines the dead one had finished were saved to
    PostgreSQL as they finished and are not run again: every request the second gateway ran for the
    batch is the output line of its custom_id, and the first one's lines are in the output as it wrote them."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(postgres_server())
        except PostgresUnavailable as e:
            pytest.skip(str(e))
        config = _config(url)
        a = stack.enter_context(ServeProcess(tmp_path / "a", config=config))
        a_client = _client(a)
        uploaded = a_client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(120, "kill", 8))), purpose="batch")
        batch = a_client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        seen = _until(
            lambda: (x := a_client.batches.retrieve(batch.id)).request_counts.completed >= 5 and x, "A to run lines"
        )
        os.kill(a.proc.pid, signal.SIGKILL)  # A's claim is not renewed any more
        assert seen.status == "in_progress" and seen.request_counts.completed < 120, seen
        a.proc.wait(30)
        num_saved = _saved_lines(url, batch.id)
        # a line is counted once saved: at least the lines A had counted were saved, and not all were done
        assert seen.request_counts.completed <= num_saved < 120, (seen.request_counts, num_saved)
        b = stack.enter_context(ServeProcess(tmp_path / "b", config=config))
        b_client = _client(b)
        done = _until(lambda: (x := b_client.batches.retrieve(batch.id)).status == "completed" and x, "B to finish")
        assert done.request_counts.completed == 120 and done.request_counts.failed == 0
        out = [json.loads(line) for line in b_client.files.content(done.output_file_id).text.splitlines()]
        assert sorted(line["custom_id"] for line in out) == sorted(f"kill-{i}" for i in range(120))  # each once
        ran_on_b = _batch_requests(b, batch.id)
        by_request = {line["response"]["request_id"]: line["custom_id"] for line in out}
        # how often each line reached B's engine: once for the lines A had not finished, never for A's
        reached = collections.Counter(by_request.get(rid, "not in the output") for rid in ran_on_b)
        assert reached and set(reached.values()) == {1} and "not in the output" not in reached, reached
        from_a = [line for line in out if line["response"]["request_id"] not in set(ran_on_b)]
        assert len(from_a) == num_saved and len(ran_on_b) == 120 - num_saved, (len(from_a), num_saved)
        assert _saved_lines(url, batch.id) == 0  # dropped once the batch finished
