"""Priority classes through a real ``tokenops serve`` (the demo chat model, two engine slots): a batch
submitted with the openai SDK's Batch API saturates the engine, then an interactive chat request
(the openai SDK, streamed) finishes before the batch lines that were queued before it, by preempting
a running batch line; /metrics and /admin/stats show the classes apart (/admin/stats: interactive figures, batch lines in their own block). With ``priority_classes``
switched off live (one first-come queue) the same interactive request waits behind them."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.serve_configs import config as serve_config
from tests.serve_configs import local_model, section
from tokenops.engine.models.default_model import shipped_model_dir
from tokenops.testing_serve import ServeProcess

API_KEY, ADMIN_KEY, METRICS_KEY = "prio-api-key-1", "prio-admin-key-1", "prio-metrics-key-1"
MODEL = "demo"
BATCH_TOKENS = 400  # each batch line decodes this many tokens (ignore_eos): long enough to be caught running
ROOT = Path(__file__).resolve().parents[2]


def documented_engine() -> str:
    """docs/batches.md's ``[engine]`` block under "Idle priority", copied from the page."""
    from tests.docs_example_checks import first_toml_block

    block = first_toml_block(ROOT / "docs" / "batches.md", "## Idle priority")
    assert "priority_classes = true" in block
    return block


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = serve_config(
        local_model(MODEL, shipped_model_dir(), engine={"max_num_seqs": 2}),
        section("gateway", api_keys={API_KEY: "acme"}, metrics_key=METRICS_KEY),
        section("batches", max_in_flight=8),
        documented_engine(),
    )
    with ServeProcess(tmp_path_factory.mktemp("prio"), config=config, admin_key=ADMIN_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0, timeout=120)


def _engine(served) -> dict:
    engines = httpx.get(served.url + "/admin/stats", headers=served.admin_headers, timeout=30).json()["engines"]
    return next(iter(engines.values()))


def _submit(client: openai.OpenAI, n: int, tag: str):
    lines = [
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Tell a long story number {i}"}],
                "max_tokens": BATCH_TOKENS,
                "ignore_eos": True,
            },
        }
        for i in range(n)
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")


def _saturated(served, n: int, timeout_s: float = 120.0) -> dict:
    """Wait until the engine runs two batch lines and holds the other ``n - 2`` waiting."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = _engine(served)
        if stats["num_running_batch"] == 2 and stats["num_waiting_batch"] == n - 2:
            return stats
        assert time.monotonic() < deadline, f"the batch never saturated the engine: {stats}"
        time.sleep(0.05)


def _interactive(client: openai.OpenAI) -> str:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi there"}], max_tokens=8, stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def _finish(client: openai.OpenAI, served, batch_id: str, timeout_s: float = 300.0) -> None:
    try:
        client.batches.cancel(batch_id)
    except openai.ConflictError:  # every line ran already: the batch is finalizing
        pass
    deadline = time.monotonic() + timeout_s
    while client.batches.retrieve(batch_id).status not in ("cancelled", "completed", "failed"):
        assert time.monotonic() < deadline, "the batch did not stop"
        time.sleep(0.2)
    while _engine(served)["num_running"] or _engine(served)["num_waiting"]:
        assert time.monotonic() < deadline, "the engine did not drain"
        time.sleep(0.2)


def test_an_interactive_request_finishes_before_the_batch_lines_queued_before_it(served, client):
    batch = _submit(client, 6, "prio")
    _saturated(served, 6)  # all six lines are in the engine ahead of it: two running, four waiting
    text = _interactive(client)
    after = _engine(served)
    assert text
    # the four lines waiting when it came are unfinished: at most the two running ones were done
    assert after["num_running_batch"] + after["num_waiting_batch"] >= 4, after
    assert client.batches.retrieve(batch.id).request_counts.completed <= 2
    # it got a slot by preempting a running batch line, which resumes later
    assert after["num_batch_preemptions"] >= 1
    metrics = httpx.get(served.url + "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}).text
    assert "tokenops:num_batch_requests_running{" in metrics
    assert "tokenops:num_batch_requests_waiting{" in metrics
    preempted = [ln for ln in metrics.splitlines() if ln.startswith("tokenops:num_batch_preemptions_total{")]
    assert preempted and float(preempted[0].rsplit(" ", 1)[1]) >= 1
    # the engine's time: the batch had it alone before the request came, then shared it
    assert 0 < after["interactive_busy_s"] < after["busy_s"], after
    busy = [ln for ln in metrics.splitlines() if ln.startswith("tokenops:engine_interactive_busy_seconds_total{")]
    assert busy and float(busy[0].rsplit(" ", 1)[1]) > 0
    _finish(client, served, batch.id)


def _stats(served) -> dict:
    return httpx.get(served.url + "/admin/stats", headers=served.admin_headers, timeout=30).json()


def test_admin_stats_shows_batch_lines_apart(served, client):
    """/admin/stats's latency and counts are interactive traffic's; batch lines have their own block."""
    before = _stats(served)
    lines = [
        {"custom_id": f"apart-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Count to {i}"}], "max_tokens": 6}}
        for i in range(3)
    ]  # fmt: skip
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    uploaded = client.files.create(file=("apart.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 180
    while client.batches.retrieve(batch.id).status != "completed":
        assert time.monotonic() < deadline, "the batch did not complete"
        time.sleep(0.2)
    assert _interactive(client)
    after = _stats(served)
    assert after["batch"]["requests"]["total"] - before["batch"]["requests"]["total"] == 3
    assert after["requests"]["total"] - before["requests"]["total"] == 1  # the interactive request only
    assert after["batch"]["latency"]["ttft"]["p95"] is not None and after["batch"]["tokens"]["total_output"] > 0


def test_the_batch_share_is_a_live_tunable_and_a_bad_value_is_a_400_naming_it(served):
    url, headers = served.url + "/admin/tunables", served.admin_headers
    bad = httpx.patch(url, headers=headers, json={"values": {"engine.batch_max_share": 1.5}}, timeout=30)
    assert bad.status_code == 400 and "engine.batch_max_share" in bad.text, bad.text
    good = httpx.patch(url, headers=headers, json={"values": {"engine.batch_max_share": 0.5}}, timeout=30)
    assert good.status_code == 200, good.text
    values = {t["name"]: t["value"] for t in httpx.get(url, headers=headers, timeout=30).json()["tunables"]}
    assert values["engine.batch_max_share"] == 0.5
    httpx.patch(url, headers=headers, json={"values": {"engine.batch_max_share": 1.0}}, timeout=30)


def test_batch_step_overhead_is_a_live_tunable_and_interactive_work_still_goes_first(served, client):
    url, headers = served.url + "/admin/tunables", served.admin_headers
    bad = httpx.patch(url, headers=headers, json={"values": {"engine.batch_step_overhead": 2}}, timeout=30)
    assert bad.status_code == 400 and "engine.batch_step_overhead" in bad.text, bad.text
    good = httpx.patch(url, headers=headers, json={"values": {"engine.batch_step_overhead": 0.1}}, timeout=30)
    assert good.status_code == 200, good.text
    try:
        batch = _submit(client, 4, "overhead")
        _saturated(served, 4)
        assert _interactive(client)  # it took a slot from the batch and ran with batch rows held back
        after = _engine(served)
        assert after["num_running_batch"] + after["num_waiting_batch"] >= 2, after
        _finish(client, served, batch.id)
    finally:
        httpx.patch(url, headers=headers, json={"values": {"engine.batch_step_overhead": 0.0}}, timeout=30)


@pytest.mark.slow
def test_without_priority_classes_the_same_request_waits_behind_the_batch(served, client):
    patch = httpx.patch(
        served.url + "/admin/tunables",
        headers=served.admin_headers,
        json={"values": {"engine.priority_classes": False}},
        timeout=30,
    )
    assert patch.status_code == 200, patch.text
    try:
        batch = _submit(client, 4, "fcfs")
        _saturated(served, 4)
        assert _interactive(client)
        after = _engine(served)
        # first come first served: it got a slot only once the two waiting lines had theirs and one
        # of them had finished, so at most one line is left
        assert after["num_running_batch"] + after["num_waiting_batch"] <= 1, after
        _finish(client, served, batch.id)
    finally:
        httpx.patch(
            served.url + "/admin/tunables",
            headers=served.admin_headers,
            json={"values": {"engine.priority_classes": True}},
            timeout=30,
        )
