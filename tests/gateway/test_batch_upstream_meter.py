"""Batch lines in front of an upstream engine (backend "openai"): vLLM's ``priority`` = 1 on batch lines
when ``priority_field = true``, and at most ``batch_max_in_flight_upstream`` batch lines in flight while
interactive requests are. The meter alone (asyncio), then through a real ``tokenops serve`` in front of
the fake upstream of tests/gateway/openai_upstream.py (slowed down here to see what is in flight), the
batch sent with the openai SDK's Batch API and the interactive request with the openai SDK."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.gateway.openai_upstream import Upstream, build_app, holding
from tests.serve_configs import config as serve_config
from tests.serve_configs import section
from tokenops.backends.openai_http_meter import BatchMeter
from tokenops.config import ConfigError, ModelConfig
from tokenops.testing_serve import ServeProcess

API_KEY = "meter-api-key-1"
ROOT = Path(__file__).resolve().parents[2]
INTERACTIVE_S, BATCH_S = 3.0, 0.4  # how long the upstream holds each kind of request


async def test_the_meter_holds_batch_lines_only_while_interactive_work_is_in_flight():
    meter = BatchMeter(limit=1)
    events: list[str] = []
    release = asyncio.Event()

    async def run(cls: str, name: str, hold: asyncio.Event | None = None) -> None:
        async with meter.hold(cls):
            events.append(f"+{name}")
            if hold is not None:
                await hold.wait()
            else:
                await asyncio.sleep(0.01)
            events.append(f"-{name}")

    free = [asyncio.create_task(run("batch", f"f{i}")) for i in range(3)]
    await asyncio.sleep(0)
    assert meter.num_batch == 3  # nothing interactive: no bound
    await asyncio.gather(*free)

    interactive = asyncio.create_task(run("interactive", "i", release))
    await asyncio.sleep(0)
    held = [asyncio.create_task(run("batch", f"b{i}", release)) for i in range(3)]
    await asyncio.sleep(0.05)
    assert meter.num_batch == 1 and meter.num_held == 2  # one in flight, two waiting
    cancelled = held[2]
    cancelled.cancel()  # a waiting line that goes away leaves no trace
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(interactive, held[0], held[1])
    assert cancelled.cancelled() and meter.num_batch == 0 and meter.num_interactive == 0
    assert events.index("-i") < events.index("+b1")  # b1 waited for the interactive request (or b0)


def test_the_settings_are_checked():
    with pytest.raises(ConfigError, match="batch_max_in_flight_upstream"):
        ModelConfig(name="m", backend="openai", url="http://x", batch_max_in_flight_upstream=-1)
    with pytest.raises(ConfigError, match="priority_field"):
        ModelConfig(name="m", backend="openai", url="http://x", priority_field="yes")


class SlowUpstream(Upstream):
    """The fake upstream of openai_upstream.py, holding each request a while and noting when each
    kind ("interactive" or "batch", from the message text) starts and ends."""

    def make_app(self) -> Any:
        self.events: list[tuple[float, str, str]] = []  # (time, "+" or "-", kind)
        return holding(build_app(self.bodies), self.hold)

    @contextlib.asynccontextmanager
    async def hold(self, raw: bytes):
        kind = "batch" if b"batch-line" in raw else "interactive"
        self.events.append((time.monotonic(), "+", kind))
        try:
            await asyncio.sleep(BATCH_S if kind == "batch" else INTERACTIVE_S)
            yield
        finally:
            self.events.append((time.monotonic(), "-", kind))

    def max_batch_in_flight_during_interactive(self) -> int:
        num = {"batch": 0, "interactive": 0}
        peak = 0
        for _, sign, kind in sorted(self.events):
            num[kind] += 1 if sign == "+" else -1
            if num["interactive"]:
                peak = max(peak, num["batch"])
        return peak


def documented_model() -> str:
    """docs/batches.md's upstream ``[[models]]`` block under "Idle priority", copied from the page."""
    from tests.test_docs_examples import blocks

    page = ROOT / "docs" / "batches.md"
    return next(b.code for b in blocks(page) if b.language == "toml" and "batch_max_in_flight_upstream" in b.code)


def test_batch_lines_yield_to_interactive_ones_at_an_upstream_engine(tmp_path):
    block = documented_model()
    model = tomllib.loads(block)["models"][0]
    limit = model["batch_max_in_flight_upstream"]
    assert model["priority_field"] is True and 1 <= limit < 6
    with SlowUpstream() as up:
        config = serve_config(
            block.replace(model["url"], up.url + "/v1"),
            section("gateway", api_keys={API_KEY: "acme"}),
            section("batches", max_in_flight=8),
        )
        name = model["name"]
        with ServeProcess(tmp_path, config=config) as srv:
            client = openai.OpenAI(base_url=srv.base_url, api_key=API_KEY, max_retries=0, timeout=120)
            answer: list[str] = []
            interactive = threading.Thread(
                target=lambda: answer.append(
                    client.chat.completions.create(
                        model=name,
                        messages=[{"role": "user", "content": "interactive hello"}],
                        max_tokens=8,
                    )
                    .choices[0]
                    .message.content
                    or ""
                )
            )
            interactive.start()
            deadline = time.monotonic() + 60
            while not any(kind == "interactive" for _, _, kind in up.events):
                assert time.monotonic() < deadline, "the interactive request never reached the upstream"
                time.sleep(0.02)
            lines = [
                {
                    "custom_id": f"l{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": name,
                        "messages": [{"role": "user", "content": f"batch-line {i}"}],
                        "max_tokens": 8,
                    },
                }
                for i in range(6)
            ]
            data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
            uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
            batch = client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            interactive.join(timeout=120)
            while (batch := client.batches.retrieve(batch.id)).status != "completed":
                assert time.monotonic() < deadline + 120, batch
                time.sleep(0.2)
    assert answer and answer[0].startswith("echo: interactive hello")
    assert batch.request_counts.completed == 6
    # while the interactive request was in flight upstream, at most `limit` batch lines were (6 without it)
    assert up.max_batch_in_flight_during_interactive() == limit
    sent = {b["messages"][-1]["content"]: b for b in up.bodies}
    assert all(sent[f"batch-line {i}"]["priority"] == 1 for i in range(6))
    assert "priority" not in sent["interactive hello"] or sent["interactive hello"]["priority"] == 0
