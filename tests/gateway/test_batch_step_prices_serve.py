"""``batch_step_overhead`` on the real default model through ``tokenops serve``: the engine measures its
decode steps by interactive and batch rows (``decode_steps`` on ``/admin/stats``, what prices the
allowance), while an interactive request streams (openai SDK) beside a running batch; the engine's busy
seconds show the batch alone before it and both after."""

from __future__ import annotations

import io
import json
import time

import httpx
import openai
from tests import real_model
from tokenops.testing_serve import ServeProcess

MODEL = real_model.MODEL


def _engine(srv: ServeProcess) -> dict:
    engines = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=30).json()["engines"]
    return next(iter(engines.values()))


def test_the_real_engine_prices_batch_rows_from_its_measured_decode_steps(tmp_path):
    config = (
        f'[[models]]\nname = "{MODEL}"\nbackend = "local"\npath = "{real_model.gguf_path()}"\n'
        "engine = { max_num_seqs = 4, batch_max_share = 1.0, batch_step_tokens = 48, batch_step_overhead = 0.05 }\n"
        "\n[batches]\nmax_in_flight = 3\n"
    )
    with ServeProcess(tmp_path, config=config, env=real_model.SERVE_ENV) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
        lines = [
            {"custom_id": f"b-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Story {i}."}],
                      "max_tokens": 800, "ignore_eos": True}}
            for i in range(3)
        ]  # fmt: skip
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 120
        while _engine(srv)["num_running_batch"] < 3:
            assert time.monotonic() < deadline, "the batch never filled its lines"
            time.sleep(0.05)
        alone = _engine(srv)
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me about Paris."}],
            max_tokens=200, stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        shared = _engine(srv)
        client.batches.cancel(batch.id)
    assert len(text) > 100
    assert alone["busy_s"] > 0 and alone["interactive_busy_s"] == 0  # the batch had the engine alone
    assert shared["interactive_busy_s"] > 0
    # one interactive decode, measured alone and with a batch row beside it (the allowance's two prices;
    # the engine's probes run those shapes 20 times each when the fit alone would not)
    steps = shared["decode_steps"]
    assert steps.get("1+0", 0) > 0 and steps.get("1+1", 0) > 0, steps
    assert shared["num_running_batch"] == 3  # the batch kept its lines: held back, not preempted
