"""The upstream batch meter's SLO (``[batches] upstream_ttft_slo_ms``, live as
``batches.upstream_ttft_slo_ms``): batch lines sent to an upstream engine are sized from the
interactive requests' measured time to first token. The meter alone on a fake clock (additive
increase, multiplicative decrease), then through a real ``tokenops serve`` in front of an upstream
whose first token comes later the more batch lines it runs (the openai SDK's Batch API and streamed
chat), the SLO set in the config and then switched off live."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import statistics
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tests.gateway.openai_upstream import Upstream, build_app, holding
from tests.serve_configs import config as serve_config
from tests.serve_configs import openai_model, section
from tokenops.backends.openai_http_meter import BatchMeter
from tokenops.batch_settings import BatchSettings
from tokenops.testing_serve import ServeProcess

API_KEY = "slo-api-key-1"
ROOT = Path(__file__).resolve().parents[2]
BATCH_S = 0.5  # how long the upstream holds a batch line
#: the upstream's first token: this, plus PER_LINE_S per batch line it runs at the time
BASE_S, PER_LINE_S = 0.05, 0.1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_slow_start_then_halving_on_a_slow_first_token_then_one_line_a_window():
    clock = Clock()
    meter = BatchMeter(limit=8, slo_s=0.5, window_s=1.0, clock=clock)
    done = asyncio.Semaphore(0)  # each release lets one running line finish

    async def line() -> None:
        async with meter.hold("batch"):
            await done.acquire()

    lines = [asyncio.create_task(line()) for _ in range(12)]
    await asyncio.sleep(0)
    assert meter.allowance == 1 and meter.num_batch == 1 and meter.num_held == 11  # slow start: one line
    clock.now += 1.0
    meter.observe_ttft(0.1)
    assert meter.allowance == 2 and meter.num_batch == 2  # a clean window with lines waiting: doubled
    clock.now += 2.0
    meter.observe_ttft(0.1)
    assert meter.allowance == 8 and meter.num_batch == 8  # two more: x4, up to the ceiling (the fixed bound)
    meter.observe_ttft(0.8)
    meter.observe_ttft(0.9)
    assert meter.allowance == 4 and meter.num_over_slo == 2  # halved once in a window, however many were slow
    clock.now += 1.0
    meter.observe_ttft(0.7)
    assert meter.allowance == 2  # the next window: halved again (no growth after a window with a slow one)
    async with meter.hold("interactive"):
        for _ in range(8):
            done.release()
        await asyncio.sleep(0.01)
        assert meter.num_batch == 2  # the eight drained; two waiting lines got in, two still wait
        clock.now += 3.0  # the window of the slow one closes, then two with lines waiting and none slow
        meter.observe_ttft(0.1)
        assert meter.allowance == 4 and meter.num_batch == 4  # past slow start: one line a clean window
    for _ in range(4):
        done.release()
    await asyncio.gather(*lines)
    assert meter.num_batch == 0


async def test_with_nothing_interactive_in_flight_one_line_always_runs():
    clock = Clock()
    meter = BatchMeter(slo_s=0.2, window_s=10.0, clock=clock)
    meter.observe_ttft(1.0)  # nothing in flight: half of none
    assert meter.allowance == 0 and meter.num_over_slo == 1
    async with meter.hold("batch"):  # nothing interactive in flight: one line runs even at 0
        assert meter.num_batch == 1
        async with meter.hold("interactive"):
            assert not meter._has_room()
            meter.set_slo(0.0)  # off (the live tunable): the fixed rule, no bound without a fixed one
            assert meter._has_room()
            meter.observe_ttft(5.0)
    assert meter.num_over_slo == 1  # nothing measured against an SLO that is off


async def test_waiting_lines_get_in_when_the_window_closes_without_another_request():
    meter = BatchMeter(slo_s=0.05, window_s=0.05)  # the real clock: a timer wakes the waiters
    meter.allowance = 1
    release = asyncio.Event()

    async def line() -> None:
        async with meter.hold("batch"):
            await release.wait()

    async with meter.hold("interactive"):
        lines = [asyncio.create_task(line()) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert meter.num_batch == 1
        deadline = time.monotonic() + 10
        while meter.num_batch < 3:  # one more line per clean window, with no request to wake them
            assert time.monotonic() < deadline, (meter.num_batch, meter.allowance)
            await asyncio.sleep(0.02)
    release.set()
    await asyncio.gather(*lines)


def test_the_setting_is_checked():
    assert BatchSettings(upstream_ttft_slo_ms=250).upstream_ttft_slo_ms == 250
    for bad in (-1, "fast", True):
        with pytest.raises(TypeError, match="upstream_ttft_slo_ms"):
            BatchSettings(upstream_ttft_slo_ms=bad)


class BusyUpstream(Upstream):
    """The fake upstream of openai_upstream.py, whose first token comes later the more batch lines it
    runs; notes how many it ran when each interactive request arrived."""

    def make_app(self) -> Any:
        self.num_batch = 0
        self.batch_at_interactive: list[tuple[float, int]] = []  # (time, batch lines running)
        return holding(build_app([]), self.hold)

    @contextlib.asynccontextmanager
    async def hold(self, raw: bytes):
        batch = b"batch-line" in raw
        if batch:
            self.num_batch += 1
        else:
            self.batch_at_interactive.append((time.monotonic(), self.num_batch))
        try:
            await asyncio.sleep(BATCH_S if batch else BASE_S + PER_LINE_S * self.num_batch)
        finally:
            if batch:
                self.num_batch -= 1
        yield


def documented_block() -> dict[str, Any]:
    from tests.test_docs_examples import blocks

    page = ROOT / "docs" / "batches.md"
    tables = [tomllib.loads(b.code) for b in blocks(page) if b.language == "toml" and "upstream_ttft_slo_ms" in b.code]
    return next(t for t in tables if t["batches"]["upstream_ttft_slo_ms"])  # the example, not the defaults


def run_batch(client: openai.OpenAI, name: str, tag: str, num: int) -> list[float]:
    """Submit ``num`` lines and stream interactive requests one after another until the batch is
    done; the client's times to first token."""
    lines = [
        {
            "custom_id": f"{tag}{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": name, "messages": [{"role": "user", "content": f"batch-line {i}"}], "max_tokens": 4},
        }
        for i in range(num)
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    uploaded = client.files.create(file=(f"{tag}.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    ttfts: list[float] = []
    deadline = time.monotonic() + 180
    while client.batches.retrieve(batch.id).status != "completed":
        assert time.monotonic() < deadline, client.batches.retrieve(batch.id)
        start = time.monotonic()
        stream = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
        for _ in stream:
            ttfts.append(time.monotonic() - start)
            break
        stream.close()
    assert client.batches.retrieve(batch.id).request_counts.completed == num
    return ttfts


def test_the_slo_sizes_the_batch_lines_at_an_upstream_and_switches_off_live(tmp_path):
    # docs/batches.md's [batches] block: at 400 ms, three batch lines running keep the first token under it
    slo_ms = documented_block()["batches"]["upstream_ttft_slo_ms"]
    assert 0.3 <= (slo_ms / 1000 - BASE_S) / PER_LINE_S < 4, "the fake upstream's shape expects about 400 ms"
    with BusyUpstream() as up:
        config = serve_config(
            openai_model("up", url=f"http://127.0.0.1:{up.port}/v1"),
            section("gateway", api_keys={API_KEY: "acme"}),
            section("batches", max_in_flight=16, upstream_ttft_slo_ms=slo_ms),
        )
        with ServeProcess(tmp_path, config=config) as srv:
            client = openai.OpenAI(base_url=srv.base_url, api_key=API_KEY, max_retries=0, timeout=120)
            start = time.monotonic()
            with_slo = run_batch(client, "up", "a", 40)
            seen_with = [n for t, n in up.batch_at_interactive if t > start + 2.0]  # past the first halvings
            r = httpx.patch(
                f"{srv.url}/admin/tunables",
                headers=srv.admin_headers,
                timeout=30,
                json={"values": {"batches.upstream_ttft_slo_ms": 0.0}},
            )
            assert r.status_code == 200, r.text
            shown = {t["name"]: t["value"] for t in r.json()["tunables"]}
            assert shown["batches.upstream_ttft_slo_ms"] == 0.0
            mark = time.monotonic()
            without = run_batch(client, "up", "b", 48)
            seen_without = [n for t, n in up.batch_at_interactive if t > mark]
    # with the SLO the upstream ran a few batch lines when interactive requests came; without, all 16
    assert seen_with and statistics.median(seen_with) <= 5, seen_with
    assert seen_without and max(seen_without) >= 12, seen_without
    # the client's first tokens: with the SLO about a third of the one behind 16 lines (1.65 s at the upstream)
    assert statistics.median(with_slo) < max(without) / 2, (with_slo, without)
