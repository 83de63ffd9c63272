"""Where a decode token's CPU time goes in the engine, in process (issue 35's batch-1 goal).

Loads ``LLMEngine`` on a GGUF (the packaged SmolLM2-135M Q4_1 by default, ``--gguf`` another: the
Q8_0 copy of ``gguf_peer.py`` lives in ``~/.cache/tokenops/gguf/``) with 2 torch threads, a 10,240-token
bfloat16 KV cache (as ``gguf_peer.py`` serves it), then decodes ``--tokens`` greedy tokens after a
64-token prompt at ``--rows`` sequences at once (1: batch-1 decode; 48: the throughput run's width).
The prompt is prefilled before timing starts. Prints tokens per wall second, the process's CPU-ms per
decoded token (``time.process_time``: what a shared box can compare) and the wall time of a step split
into the native forward (``runner.execute``), sampling (``Sampler.sample``), the output processor
(``append_token`` + ``make_output``), the scheduler (``schedule`` + ``update_computed``), the stats the
async engine takes after each step, and the rest of ``LLMEngine.step``. The split times each part with
``time.perf_counter_ns`` wrappers installed on the objects (their cost, ~1 us a call, is in "rest").

Run: ``.venv/bin/python tests/benchmarks/decode_overhead.py [--rows 48] [--gguf FILE] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(counter: collections.Counter, key: str, fn):
    """``fn`` wrapped so its wall time adds up under ``key``."""

    def wrapper(*a, **k):
        t0 = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            counter[key] += time.perf_counter_ns() - t0

    return wrapper


def instrument(engine, counter: collections.Counter) -> None:
    """Per-part timers on ``engine``'s objects (instance attributes shadow the methods)."""
    runner, sched, proc = engine.runner, engine.scheduler, engine.output_processor
    runner.execute = timed(counter, "native forward (runner.execute)", runner.execute)
    if hasattr(runner, "execute_greedy"):
        runner.execute_greedy = timed(counter, "native forward (runner.execute)", runner.execute_greedy)
    engine.sampler.sample = timed(counter, "sampling", engine.sampler.sample)
    proc.append_token = timed(counter, "output processor", proc.append_token)
    proc.make_output = timed(counter, "output processor", proc.make_output)
    sched.schedule = timed(counter, "scheduler", sched.schedule)
    sched.update_computed = timed(counter, "scheduler", sched.update_computed)


def run(engine, rows: int, tokens: int, counter: collections.Counter | None) -> tuple[float, float, int]:
    """Decode ``tokens`` after a 64-token prompt in ``rows`` sequences; returns wall s, CPU s, tokens."""
    from tokenops.engine.sampling.sampling import SamplingParams

    params = SamplingParams(max_tokens=tokens + 1, temperature=0.0, ignore_eos=True)
    for i in range(rows):
        engine.add_request(f"r{i}-{time.monotonic_ns()}", [(7 * i + j) % 4000 + 100 for j in range(64)], params)
    while engine.scheduler.waiting or any(s.is_prefill for s in engine.scheduler.running):
        engine.step()  # prefill (and the first token) untimed
    engine.stats()
    if counter is not None:
        counter.clear()  # the parts' timers ran during the prefill too
    step = engine.step
    if counter is not None:
        step = timed(counter, "LLMEngine.step", engine.step)
    made, wall0, cpu0 = 0, time.perf_counter(), time.process_time()
    while engine.has_unfinished():
        for out in step():
            made += 0 if out.finished and not out.outputs else 1
        if counter is not None:
            t0 = time.perf_counter_ns()
            engine.stats()
            counter["stats after the step (async engine)"] += time.perf_counter_ns() - t0
        else:
            engine.stats()
    return time.perf_counter() - wall0, time.process_time() - cpu0, rows * tokens


def run_async(aengine, rows: int, tokens: int) -> tuple[float, float, int]:
    """The same decode through :class:`AsyncLLMEngine` (its engine thread, the event loop that streams
    each token): the serve path without HTTP. Timed from the first streamed token of the last row."""
    import asyncio

    from tokenops.engine.core.async_engine import AsyncLLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams

    params = SamplingParams(max_tokens=tokens + 1, temperature=0.0, ignore_eos=True)

    async def one(i: int, started: list) -> int:
        num = 0
        prompt = [(7 * i + j + time.monotonic_ns()) % 4000 + 100 for j in range(64)]
        async for out in aengine.generate(prompt, params):
            if not started:
                started.append((time.perf_counter(), time.process_time()))
            num += len(out.outputs[0].delta_token_ids) if out.outputs else 0
        return num

    async def main() -> tuple[float, float]:
        started: list = []
        await asyncio.gather(*(one(i, started) for i in range(rows)))
        return time.perf_counter() - started[0][0], time.process_time() - started[0][1]

    wall, cpu = asyncio.run(main())
    return wall, cpu, rows * tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the packaged SmolLM2 Q4_1)")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--omp-spin",
        type=int,
        default=0,
        help="TOKENOPS_OMP_SPIN for this run: a bounded barrier spin (tokenops/engine/kernels/openmp_wait.py)",
    )
    ap.add_argument("--async-engine", action="store_true", help="through AsyncLLMEngine (the serve path minus HTTP)")
    ap.add_argument(
        "--build-elsewhere",
        action="store_true",
        help="with --async-engine: build the engine on the main thread, step it on the engine thread "
        "(the serve path before build_on_engine_thread: two OpenMP pools)",
    )
    args = ap.parse_args()
    if args.omp_spin:  # as tokenops serve does with TOKENOPS_OMP_SPIN, before torch is imported
        import os

        from tokenops.engine.kernels.openmp_wait import SPIN_ENV, apply_spin_setting

        os.environ[SPIN_ENV] = str(args.omp_spin)
        apply_spin_setting()
    from real_model import gguf_path

    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine

    path = args.gguf or str(gguf_path())
    cfg = EngineConfig(
        model=path,
        torch_threads=args.threads,
        kv_cache_tokens=10240,
        kv_cache_dtype="bfloat16",
        max_num_seqs=max(48, args.rows),
    )
    if args.async_engine:
        from tokenops.engine.core.async_engine import AsyncLLMEngine

        if args.build_elsewhere:  # the serve path before: built on another thread than the one stepping
            aengine = AsyncLLMEngine(LLMEngine(cfg))
        else:  # as tokenops serve builds it: on the engine thread
            aengine = AsyncLLMEngine.build_on_engine_thread(lambda: LLMEngine(cfg))
        engine = aengine.engine
        run_async(aengine, args.rows, 16)  # warm up
    else:
        engine = LLMEngine(cfg)
        run(engine, args.rows, 16, None)  # warm up
    best = None
    for _ in range(args.repeats):
        if args.async_engine:
            wall, cpu, num = run_async(aengine, args.rows, args.tokens)
        else:
            wall, cpu, num = run(engine, args.rows, args.tokens, None)
        if best is None or wall < best[0]:
            best = (wall, cpu, num)
    wall, cpu, num = best
    print(
        f"{Path(path).name}: {args.rows} rows x {args.tokens} tokens after 64, {args.threads} threads, best of "
        f"{args.repeats}: {num / wall:.1f} tok/s, {1000 * cpu / num:.2f} CPU-ms per token, "
        f"{cpu / wall:.2f} cores busy{' (AsyncLLMEngine)' if args.async_engine else ''}"
    )
    if args.async_engine:
        return
    counter: collections.Counter = collections.Counter()
    instrument(engine, counter)
    wall, cpu, num = run(engine, args.rows, args.tokens, counter)
    steps = num // args.rows
    total = counter.pop("LLMEngine.step")
    stats = counter.pop("stats after the step (async engine)")
    print(f"instrumented run: {num / wall:.1f} tok/s; wall us per step ({steps} steps):")
    for key, ns in counter.most_common():
        print(f"  {ns / steps / 1000:9.1f}  {key}")
    print(f"  {(total - sum(counter.values())) / steps / 1000:9.1f}  rest of LLMEngine.step")
    print(f"  {stats / steps / 1000:9.1f}  stats after the step (async engine)")
    print(f"  {(total + stats) / steps / 1000:9.1f}  total")


if __name__ == "__main__":
    main()
