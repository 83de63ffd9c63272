"""Where an interactive request's time to first token goes beside a batch, in the engine alone
(issue 55's TTFT goal): the scheduler and the steps, without HTTP or the gateway.

Loads ``LLMEngine`` on the default model (SmolLM2-135M GGUF, ``max_num_seqs`` 16, 2 torch threads)
and steps it in this process. Interactive requests, ShareGPT-shaped (prompts up to 384 tokens, answers
8 to 96), arrive Poisson at ``--rate`` req/s for ``--seconds``; a request that arrives during a step
is added after it, as the async engine's inbox does. With ``--batch`` the engine also holds
``--batch-lines`` batch lines of the same shape at all times (a finished line is replaced at once, as
the runner's ``max_in_flight`` keeps the engine's queue full). For each setting it prints TTFT p50/p95
and its parts, summed per request: the wait for the step in progress at arrival, the steps before the
request's first chunk (queued), the steps from its first chunk to its first token (prefill), and what
batch work each of those steps carried (batch tokens in the steps an interactive request waited on).

Run: ``.venv/bin/python tests/benchmarks/batch_ttft_steps.py [--seconds 40] [--rate 1.0] [--share 0.1]
[--step-tokens 0,128]`` (one batch run per ``batch_step_tokens`` value)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPE = {"max_input_len": 384, "max_output_len": 96, "min_output_len": 8}


@dataclass
class Timing:
    arrival: float
    added: float = 0.0
    first_chunk: float | None = None
    first_token: float | None = None
    wait_step_s: float = 0.0  # arrival -> the end of the step in progress
    batch_tokens_seen: int = 0  # batch tokens in the steps from arrival to the first token
    steps: list[float] = field(default_factory=list)


def prompts(engine: Any, n: int, seed: int) -> list[tuple[list[int], int]]:
    from tokenops.bench.sharegpt import sharegpt

    out = []
    for req in sharegpt(n, seed=seed, **SHAPE):
        text = "\n".join(m["content"] for m in req.messages)
        out.append((engine.tokenizer.encode(text)[: SHAPE["max_input_len"]], req.max_tokens))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def run(engine: Any, args: argparse.Namespace, with_batch: bool, seed: int) -> dict[str, Any]:
    from tokenops.engine.sampling.sampling import SamplingParams

    rng = random.Random(seed)
    inter = prompts(engine, int(args.rate * args.seconds) + 8, seed=4)
    batch = prompts(engine, 400, seed=2)
    arrivals, t = [], 0.0
    while len(arrivals) < len(inter):
        t += rng.expovariate(args.rate)
        if t > args.seconds:
            break
        arrivals.append(t)
    timings: dict[str, Timing] = {}
    num_batch, batch_tokens_out, next_batch = 0, 0, 0

    def add_batch() -> None:
        nonlocal num_batch, next_batch
        ids, max_tokens = batch[next_batch % len(batch)]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(f"b{seed}-{next_batch}", ids, params, priority_class="batch")
        next_batch += 1
        num_batch += 1

    if with_batch:
        for _ in range(args.batch_lines):
            add_batch()
        warm = time.time() + 3.0  # the batch alone first: its first wave of prompts done
        while time.time() < warm:
            for out in engine.step():
                if out.finished:
                    num_batch -= 1
                    add_batch()
    step_times: list[tuple[float, int, int]] = []  # (seconds, interactive tokens, batch tokens)
    start = time.time()
    i = 0
    while i < len(arrivals) or any(not r.startswith("b") for r in engine._requests):
        now = time.time() - start
        while i < len(arrivals) and arrivals[i] <= now:
            rid = f"i{seed}-{i}"
            ids, max_tokens = inter[i]
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            timings[rid] = Timing(arrival=start + arrivals[i], added=time.time())
            engine.add_request(rid, ids, params)
            i += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(0.01, arrivals[i] - now)) if i < len(arrivals) else 0)
            continue
        t0 = time.time()
        sched = engine.scheduler
        before = {s.request_id: s.num_computed_tokens for s in sched.running}
        outs = engine.step()
        t1 = time.time()
        num_i = num_b = 0
        for s in sched.running:  # tokens this step computed, by class
            done = s.num_computed_tokens - before.get(s.request_id, 0)
            if s.is_batch:
                num_b += max(0, done)
            else:
                num_i += max(0, done)
        step_times.append((t1 - t0, num_i, num_b))
        for tm in timings.values():
            if tm.first_token is not None:
                continue
            if tm.arrival < t1:
                tm.batch_tokens_seen += num_b
                if t0 < tm.arrival:
                    tm.wait_step_s = t1 - tm.arrival
        for out in outs:
            rid = out.request_id
            if rid.startswith("b"):
                if out.finished:
                    batch_tokens_out += sum(len(c.token_ids) for c in out.outputs)
                    num_batch -= 1
                    if with_batch:
                        add_batch()
                continue
            tm = timings[rid]
            if tm.first_token is None and out.outputs and out.outputs[0].token_ids:
                tm.first_token = t1
                seq_sched = out.first_scheduled_time
                tm.first_chunk = seq_sched
    if with_batch:
        for rid in [r for r in engine._requests if r.startswith("b")]:
            engine.abort(rid)
        while engine.has_unfinished():
            engine.step()
    ttft = [tm.first_token - tm.arrival for tm in timings.values() if tm.first_token]
    queued = [(tm.first_chunk or tm.added) - tm.added for tm in timings.values() if tm.first_token]
    prefill = [tm.first_token - (tm.first_chunk or tm.added) for tm in timings.values() if tm.first_token]
    waits = [tm.wait_step_s for tm in timings.values() if tm.first_token]
    seen = [tm.batch_tokens_seen for tm in timings.values() if tm.first_token]
    steps = [s for s, _, _ in step_times]
    return {
        "n": len(ttft),
        "ttft_p50": statistics.median(ttft),
        "ttft_p95": pct(ttft, 95),
        "wait_step_p95": pct(waits, 95),
        "queued_p95": pct(queued, 95),
        "prefill_p95": pct(prefill, 95),
        "batch_tokens_seen_p95": pct(seen, 95),
        "step_p95": pct(steps, 95),
        "step_mean": statistics.fmean(steps) if steps else float("nan"),
        "steps_with_batch_prefill": sum(1 for _, _, b in step_times if b > 16),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--rate", type=float, default=1.0, help="interactive requests/s")
    ap.add_argument("--share", type=float, default=0.1, help="engine batch_max_share")
    ap.add_argument("--step-tokens", default="0", help="engine batch_step_tokens, comma-separated: one run each")
    ap.add_argument("--batch-lines", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    from real_model import gguf_path
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine

    cfg = EngineConfig(model=str(gguf_path()), torch_threads=2, max_num_seqs=16, batch_max_share=args.share)
    engine = LLMEngine(cfg)
    run(engine, argparse.Namespace(**{**vars(args), "seconds": 5.0}), False, seed=99)  # warm-up
    rows = []
    for r in range(args.repeat):
        kinds = [("interactive only", False, 0)]
        kinds += [(f"+ batch, step {n}", True, int(n)) for n in args.step_tokens.split(",")]
        for name, with_batch, step_tokens in kinds:
            engine.config.batch_step_tokens = step_tokens
            rows.append((name, run(engine, args, with_batch, seed=r)))
            print(name, rows[-1], file=sys.stderr, flush=True)
    keys = list(rows[0][1])
    print(f"{'run':<22}" + "".join(f"{k:>14}" for k in keys))
    for name, row in rows:
        print(
            f"{name:<22}" + "".join(f"{row[k]:>14.3f}" if isinstance(row[k], float) else f"{row[k]:>14}" for k in keys)
        )


if __name__ == "__main__":
    main()
