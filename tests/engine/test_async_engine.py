"""AsyncLLMEngine: streaming, concurrency, cancellation, errors, abort, thread-safe tuning."""

import asyncio
import time

import pytest

from engine_fakes import FakeRunner, FakeTokenizer, reference_greedy
from tokenops.engine.core.async_engine import AsyncLLMEngine
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import EngineRequestError, LLMEngine, PromptTooLongError
from tokenops.engine.sampling.sampling import SamplingParams


@pytest.fixture
def engine():
    runner = FakeRunner(num_blocks=64, block_size=4)
    config = EngineConfig(block_size=4, kv_cache_tokens=256, max_num_batched_tokens=16)
    eng = AsyncLLMEngine(LLMEngine(config, runner=runner))
    yield eng
    eng.shutdown()


async def collect(engine, prompt, params, **kw):
    outs = []
    async for out in engine.generate(prompt, params, **kw):
        outs.append(out)
    return outs


def wait_idle(engine, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end:
        if engine.stats()["num_running"] == 0 and engine.stats()["num_waiting"] == 0:
            return
        time.sleep(0.01)
    raise AssertionError("engine did not go idle")


async def test_stream_deltas_add_up_to_the_final_output(engine):
    prompt = FakeTokenizer().encode("stream me")
    outs = await collect(engine, prompt, SamplingParams(temperature=0, max_tokens=10))
    assert outs[-1].finished and all(not o.finished for o in outs[:-1])
    final = outs[-1].outputs[0]
    assert final.token_ids == reference_greedy(prompt, 10) and final.finish_reason == "length"
    assert sum((o.outputs[0].delta_token_ids for o in outs), []) == final.token_ids
    assert "".join(o.outputs[0].delta_text for o in outs) == final.text
    assert outs[-1].first_token_time >= outs[-1].arrival_time


async def test_concurrent_requests_are_batched_and_correct(engine):
    tok = FakeTokenizer()
    prompts = [tok.encode(f"concurrent request {i}") for i in range(6)]
    results = await asyncio.gather(*(collect(engine, p, SamplingParams(temperature=0, max_tokens=8)) for p in prompts))
    for p, outs in zip(prompts, results):
        assert outs[-1].outputs[0].token_ids == reference_greedy(p, 8)
    assert engine.stats()["num_steps"] < 6 * 9  # shared steps, not one request at a time


async def test_consumer_leaving_aborts_and_frees_blocks(engine):
    agen = engine.generate(FakeTokenizer().encode("long one"), SamplingParams(temperature=0, max_tokens=200))
    first = await agen.__anext__()
    assert not first.finished
    await agen.aclose()
    await asyncio.to_thread(wait_idle, engine)
    assert engine.stats()["kv_blocks_used"] == 0


async def test_cancelled_task_aborts(engine):
    engine.engine.runner.step_delay_s = 0.005
    started = asyncio.Event()

    async def consume():
        async for _ in engine.generate([0, 5, 6], SamplingParams(temperature=0, max_tokens=200)):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.to_thread(wait_idle, engine)
    assert engine.stats()["kv_blocks_used"] == 0
    assert engine.stats()["total_generation_tokens"] < 200


async def test_prompt_too_long_raises_in_the_iterator(engine):
    with pytest.raises(PromptTooLongError):
        await collect(engine, [5] * 300, SamplingParams())
    # the loop is still serving
    outs = await collect(engine, [0, 9], SamplingParams(temperature=0, max_tokens=2))
    assert outs[-1].finished


async def test_a_failing_request_raises_only_for_itself(engine):
    engine.engine.runner.fail_on_token = 77
    good_prompt = [0, 10, 11]
    bad, good = await asyncio.gather(
        collect(engine, [0, 77], SamplingParams(temperature=0, max_tokens=4)),
        collect(engine, good_prompt, SamplingParams(temperature=0, max_tokens=4)),
        return_exceptions=True,
    )
    assert isinstance(bad, EngineRequestError) and "injected" in str(bad)
    assert good[-1].outputs[0].token_ids == reference_greedy(good_prompt, 4)


async def test_external_abort_ends_the_stream(engine):
    engine.engine.runner.step_delay_s = 0.005
    outs = []
    async for out in engine.generate([0, 3, 4], SamplingParams(temperature=0, max_tokens=500), request_id="victim"):
        outs.append(out)
        if len(outs) == 2:
            engine.abort("victim")
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"


async def test_tunables_and_stats_from_another_thread(engine):
    engine.start()
    engine.start()  # idempotent
    applied = await asyncio.to_thread(engine.apply_tunables, {"engine.max_num_batched_tokens": 16})
    assert applied == {"engine.max_num_batched_tokens": 16}
    await collect(engine, [0] + [5] * 40, SamplingParams(temperature=0, max_tokens=2))
    stats = engine.stats()
    assert stats["last_batch_tokens"] <= 16 and stats["model"] == "fake"
    assert engine.model_name == "fake" and engine.max_model_len == 256 and engine.tokenizer is not None


async def test_shutdown_fails_running_streams():
    runner = FakeRunner()
    eng = AsyncLLMEngine(LLMEngine(EngineConfig(block_size=4, kv_cache_tokens=256), runner=runner))
    runner.step_delay_s = 0.005
    agen = eng.generate([0, 1, 2], SamplingParams(temperature=0, max_tokens=200))
    await agen.__anext__()
    await asyncio.to_thread(eng.shutdown)
    assert not eng.is_running
    with pytest.raises(EngineRequestError):
        while True:
            await agen.__anext__()


async def test_stats_do_not_wait_for_a_running_step(engine):
    engine.engine.runner.step_delay_s = 1.0
    agen = engine.generate([0, 5, 6], SamplingParams(temperature=0, max_tokens=5))
    await agen.__anext__()  # a step is (about to be) running
    start = time.perf_counter()
    for _ in range(5):
        stats = await asyncio.to_thread(engine.stats)
    # five reads took less than the one step in flight: none waited for it
    assert time.perf_counter() - start < engine.engine.runner.step_delay_s and stats["num_steps"] >= 1
    await agen.aclose()
