"""``batch_upstream_queue``: the batch meter reads the upstream's waiting requests off its ``/metrics``
(vLLM, SGLang, tokenops names) and lets no batch line in while any wait there; after a reading of zero
at most as many as are in flight (at least one) until the next. The meter alone, on a scripted
``/metrics``; tests/gateway/test_batch_upstream_real_serve.py runs it in front of a real engine."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from tokenops.backends.openai_http_meter import BatchMeter
from tokenops.backends.upstream_queue import waiting_requests
from tokenops.config import ConfigError, ModelConfig

VLLM = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 3.0
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 16.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 2.0
"""
SGLANG = 'sglang:num_queue_reqs{model_name="m"} 4\nsglang:num_running_reqs{model_name="m"} 8\n'
TOKENOPS = 'tokenops:num_requests_waiting{model_name="smollm2", label="a } b"} 1\n'


def test_the_waiting_requests_of_each_engine_are_read_and_summed():
    assert waiting_requests(VLLM) == 5  # both engines' queues
    assert waiting_requests(SGLANG) == 4
    assert waiting_requests(TOKENOPS) == 1  # a brace inside a label value
    assert waiting_requests("vllm:num_requests_running 3\n") is None  # none of the names
    assert waiting_requests("") is None


class Upstream:
    """A scripted ``/metrics``: ``waiting`` is what the next reading says."""

    def __init__(self, waiting: int | None = 0, status: int = 200) -> None:
        self.waiting, self.status, self.num_reads = waiting, status, 0

    async def fetch(self):
        self.num_reads += 1
        text = "" if self.waiting is None else f"vllm:num_requests_waiting {self.waiting}\n"
        return SimpleNamespace(status_code=self.status, text=text)


async def _until(cond, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)


async def test_no_batch_line_goes_in_while_requests_wait_upstream_and_lines_double_per_clean_reading():
    upstream = Upstream(waiting=0)
    meter = BatchMeter()
    meter.watch_queue(upstream.fetch, interval_s=0.02)
    release = asyncio.Event()
    started: list[int] = []

    async def line(i: int) -> None:
        async with meter.hold("batch"):
            started.append(i)
            await release.wait()

    lines = [asyncio.create_task(line(i)) for i in range(8)]
    await asyncio.sleep(0)
    assert started == [0]  # before any reading: one line
    await _until(lambda: len(started) == 8)  # readings of zero: 1, then 1 more, 2, 4 ... as the lines in flight
    assert upstream.num_reads >= 3

    upstream.waiting = 3  # the upstream's slots are full: requests wait there
    reads = upstream.num_reads
    await _until(lambda: upstream.num_reads > reads + 1)
    release.set()  # the 8 finish ...
    await asyncio.gather(*lines)
    release.clear()
    more = [asyncio.create_task(line(10 + i)) for i in range(2)]
    reads = upstream.num_reads
    await _until(lambda: upstream.num_reads >= reads + 3)
    assert started[8:] == []  # ... and none goes in while the upstream still reports a queue
    assert meter.num_held >= 2
    upstream.waiting = 0
    await _until(lambda: len(started) == 10)
    release.set()
    await asyncio.gather(*more)
    assert meter.num_batch == 0


async def test_interactive_requests_are_never_held_and_an_unreadable_metrics_turns_the_gate_off():
    upstream = Upstream(waiting=5)
    meter = BatchMeter()
    meter.watch_queue(upstream.fetch, interval_s=0.02)
    async with meter.hold("interactive"):  # the upstream's queue does not hold interactive work
        pass
    first = asyncio.create_task(_hold_line(meter))
    await _until(lambda: upstream.num_reads >= 2)
    assert meter.num_batch == 1  # the first line (before any reading) runs ...
    second = asyncio.create_task(_hold_line(meter))
    await asyncio.sleep(0.1)
    assert meter.num_batch == 1 and meter.num_held == 1  # ... the next waits on the queue of 5
    upstream.status = 404  # an upstream without /metrics (or a refused key): the gate opens
    meter.watch.retry_s = 0.02
    await _until(lambda: meter.num_batch == 2)
    assert meter.upstream_waiting is None
    for task in (first, second):
        task.cancel()
    await asyncio.gather(first, second, return_exceptions=True)


async def _hold_line(meter: BatchMeter) -> None:
    async with meter.hold("batch"):
        await asyncio.sleep(3600)


def test_the_setting_is_checked():
    assert ModelConfig(name="m", backend="openai", url="http://x", batch_upstream_queue=True).batch_upstream_queue
    with pytest.raises(ConfigError, match="batch_upstream_queue must be true or false"):
        ModelConfig(name="m", backend="openai", url="http://x", batch_upstream_queue="yes")
