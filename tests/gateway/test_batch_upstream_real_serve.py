"""The upstream batch meter in front of a real engine: a second ``tokenops serve`` on the real default model
(SmolLM2-135M GGUF) is the upstream of a gateway whose model is ``backend = "openai"`` with
``batch_max_in_flight_upstream = 1``. While an interactive request streams through the gateway (the
openai SDK), the upstream engine runs at most one batch line beside it; once it is done the batch runs
``[batches] max_in_flight`` lines there at once; every line is answered once. The fake upstream's tests
(test_batch_upstream_meter.py, test_batch_upstream_slo.py) check the meter's rules exactly; this one that
a real engine behind it sees them."""

from __future__ import annotations

import io
import json
import threading
import time
import tomllib
from pathlib import Path

import httpx
import openai
from tests import real_model
from tests.serve_configs import config as serve_config
from tests.serve_configs import openai_model, section
from tokenops.backends.upstream_queue import waiting_requests
from tokenops.testing_serve import ServeProcess

ROOT = Path(__file__).resolve().parents[2]
MAX_IN_FLIGHT = 4
NUM_LINES = 16
QUEUE_LINES = 12


def _engine(srv: ServeProcess) -> dict:
    engines = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=30).json()["engines"]
    return next(iter(engines.values()))


def _upstream(tmp_path: Path, max_num_seqs: int) -> ServeProcess:
    """The upstream: ``tokenops serve`` on the real default model with ``max_num_seqs`` slots (the
    gateway runs in ``tmp_path / "gw"``)."""
    (tmp_path / "up").mkdir()
    (tmp_path / "gw").mkdir()
    config = (
        f'[[models]]\nname = "{real_model.MODEL}"\nbackend = "local"\npath = "{real_model.gguf_path()}"\n'
        f"engine = {{ max_num_seqs = {max_num_seqs} }}\n"
    )
    return ServeProcess(tmp_path / "up", config=config, env=real_model.SERVE_ENV)


def _submit(client: openai.OpenAI, model: str, tag: str, n: int, max_tokens: int):
    """A batch of ``n`` chat lines (``{tag}-{i}``, ``max_tokens`` each, ignore_eos) through the Batch API."""
    lines = [
        {"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "messages": [{"role": "user", "content": f"Count to {i + 3}."}],
                  "max_tokens": max_tokens, "ignore_eos": True}}
        for i in range(n)
    ]  # fmt: skip
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")


def test_a_real_upstream_engine_runs_one_batch_line_beside_a_streaming_request(tmp_path):
    with _upstream(tmp_path, max_num_seqs=8) as up:
        gateway_config = serve_config(
            openai_model("edge", up.base_url, served_model=real_model.MODEL, batch_max_in_flight_upstream=1),
            section("batches", max_in_flight=MAX_IN_FLIGHT),
        )
        with ServeProcess(tmp_path / "gw", config=gateway_config) as gw:
            client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
            streamed: list[str] = []
            first = threading.Event()

            def interactive() -> None:
                stream = client.chat.completions.create(
                    model="edge", messages=[{"role": "user", "content": "Tell me a long story."}],
                    max_tokens=150, stream=True, extra_body={"ignore_eos": True},
                )  # fmt: skip
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        streamed.append(chunk.choices[0].delta.content)
                        first.set()

            talker = threading.Thread(target=interactive)
            talker.start()
            assert first.wait(120), "the interactive request never streamed"
            batch = _submit(client, "edge", "line", NUM_LINES, max_tokens=64)
            beside, after = [], []  # the upstream engine's running requests, while it streams and after
            deadline = time.monotonic() + 300
            while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled"):
                assert time.monotonic() < deadline, batch
                running = _engine(up)["num_running"]
                if len(streamed) < 140:  # the upstream is still generating it: it is in flight at the meter
                    beside.append(running)
                elif not talker.is_alive():
                    after.append(running)
                time.sleep(0.02)
            talker.join(timeout=120)
            output = client.files.content(batch.output_file_id).text
    assert batch.status == "completed" and batch.request_counts.completed == NUM_LINES, batch
    ids = [json.loads(line)["custom_id"] for line in output.splitlines()]
    assert sorted(ids) == sorted(f"line-{i}" for i in range(NUM_LINES))  # each line answered once
    assert len(streamed) > 50  # the interactive request streamed to its end
    # beside the streaming request the upstream ran it and at most one batch line; the meter's bound,
    # not the runner's: once it was done the lines ran up to [batches] max_in_flight at once
    assert beside and max(beside) <= 2, beside
    assert after and max(after) > 2, after


def documented_queue_model() -> dict:
    """docs/batches.md's ``batch_upstream_queue`` block, copied from the page."""
    from tests.test_docs_examples import blocks

    page = ROOT / "docs" / "batches.md"
    code = next(b.code for b in blocks(page) if b.language == "toml" and "batch_upstream_queue" in b.code)
    return tomllib.loads(code)["models"][0]


def test_batch_lines_wait_while_the_real_upstream_reports_a_queue(tmp_path):
    model = documented_queue_model()
    assert model["batch_upstream_queue"] is True
    with _upstream(tmp_path, max_num_seqs=2) as up:
        gateway_config = serve_config(
            openai_model(model["name"], up.base_url, served_model=real_model.MODEL,
                         batch_upstream_queue=model["batch_upstream_queue"]),
            section("batches", max_in_flight=QUEUE_LINES),
        )  # fmt: skip
        with ServeProcess(tmp_path / "gw", config=gateway_config) as gw:
            client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
            batch = _submit(client, model["name"], "q", QUEUE_LINES, max_tokens=48)
            waiting, running = [], []
            deadline = time.monotonic() + 300
            while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled"):
                assert time.monotonic() < deadline, batch
                running.append(_engine(up)["num_running"])
                waiting.append(waiting_requests(httpx.get(up.url + "/metrics", timeout=30).text))  # all it queues
                time.sleep(0.02)
            output = client.files.content(batch.output_file_id).text
    assert batch.status == "completed" and batch.request_counts.completed == QUEUE_LINES, batch
    ids = sorted(json.loads(line)["custom_id"] for line in output.splitlines())
    assert ids == sorted(f"q-{i}" for i in range(QUEUE_LINES))
    # the upstream's two slots were kept busy, and its queue short: lines went in as it reported room
    # (the lines in flight double per reading of zero: 2 waiting at most, measured; 4 allows a slow
    # reading on a loaded machine; without the gate QUEUE_LINES - 2 = 10 wait)
    assert max(running) == 2, running
    assert max(waiting) <= 4, waiting
