"""Issue 55's idle-priority goal in virtual time: the real scheduler (priority classes, preemption,
``batch_max_share``, ``batch_step_tokens``), no model, a step costing ``--step-ms`` plus ``--token-ms``
per token it computes (a CPU's step grows with its tokens; the defaults are SmolLM2-135M on 2 cores).

A shared box makes wall-clock latency too noisy to tell one scheduling rule from another; here the
same arrivals meet each rule on the same clock. Interactive requests arrive Poisson at ``--load``
of the engine's request capacity (prompts 16..384 tokens, answers 8..96, seeded); a batch keeps
``--batch-lines`` lines in the engine (a finished one is replaced, as the runner does). For each
setting: interactive TTFT p95 and TPOT p95 against interactive-only, the batch's generated tokens/s,
and the share of the idle capacity it took: batch tokens/s over (capacity - that run's interactive
tokens/s), capacity being the most generated tokens/s any run made (never above 100%).

    .venv/bin/python tests/benchmarks/batch_priority_sim.py [--seconds 600] [--settings 1.0:0,0.1:64,1.0:64:0.08]

(``share:step_tokens[:overhead[:nc]]``: ``batch_max_share``, ``batch_step_tokens``, ``batch_step_overhead``;
``nc``: without the credit, each step's own allowance only, as before it.)
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MAX_NUM_SEQS = 16


@dataclass
class Run:
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    interactive_tokens: int = 0
    batch_tokens: int = 0
    num_batch_preemptions: int = 0
    seconds: float = 0.0
    interactive_s: float = 0.0  # virtual seconds of steps that computed interactive work
    interactive_step_s: float = 0.0  # what those steps would have cost without their batch tokens


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else float("nan")


def simulate(
    args: argparse.Namespace,
    rate: float,
    batch: bool,
    share: float,
    step_tokens: int,
    classes: bool,
    overhead: float = 0.0,
    flags: str = "",
) -> Run:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.policies import BUILTIN_SCHEDULE_ORDERS
    from tokenops.engine.core.scheduler import Scheduler
    from tokenops.engine.core.sequence import BATCH, INTERACTIVE, Sequence
    from tokenops.engine.sampling.sampling import SamplingParams

    config = EngineConfig(
        max_num_seqs=MAX_NUM_SEQS,
        priority_classes=classes,
        batch_max_share=share,
        batch_step_tokens=step_tokens,
        batch_step_overhead=overhead,
    )
    sched = Scheduler(config, config.num_kv_blocks, BUILTIN_SCHEDULE_ORDERS)
    if "nc" in flags:
        sched.credit_rows = 0  # each step's own allowance only, as before the credit
    rng, brng = random.Random(args.seed), random.Random(args.seed + 1)
    arrivals, t = [], 0.0
    while rate > 0 and t < args.seconds:
        t += rng.expovariate(rate)
        arrivals.append((t, rng.randint(16, 384), rng.randint(8, 96)))
    run, now, i, n = Run(), 0.0, 0, 0
    first: dict[str, float] = {}
    born: dict[str, float] = {}

    def add(cls: str, prompt: int, answer: int, at: float) -> None:
        nonlocal n
        n += 1
        ids = [(n * 31 + j) % 30000 + 1 for j in range(prompt)]  # no prefix shared between requests
        seq = Sequence(f"{cls}{n}", ids, SamplingParams(max_tokens=answer), arrival_time=at, priority_class=cls)
        born[seq.request_id] = at
        sched.add(seq)

    def add_line() -> None:
        add(BATCH, brng.randint(16, 384), brng.randint(8, 96), now)

    for _ in range(args.batch_lines if batch else 0):
        add_line()
    while now < args.seconds:
        while i < len(arrivals) and arrivals[i][0] <= now:
            add(INTERACTIVE, arrivals[i][1], arrivals[i][2], arrivals[i][0])
            i += 1
        out = sched.schedule()
        if out.is_empty:
            now = arrivals[i][0] if i < len(arrivals) else args.seconds
            continue
        cost = step_ms(args, out.chunks)
        now += cost / 1000
        sched.step_cost.observe_chunks(out.chunks, cost / 1000)  # the engine feeds its fit the same way
        if any(not c.seq.is_batch for c in out.chunks):
            run.interactive_s += cost / 1000
            run.interactive_step_s += step_ms(args, [c for c in out.chunks if not c.seq.is_batch]) / 1000
        sched.update_computed(out)
        for chunk in out.chunks:
            seq = chunk.seq
            if not chunk.is_last:
                continue
            seq.token_ids.append(7)
            rid = seq.request_id
            if seq.is_batch:
                run.batch_tokens += 1
            else:
                run.interactive_tokens += 1
                first.setdefault(rid, now)
            if seq.num_output_tokens >= seq.params.max_tokens:
                sched.finish(seq)
                if seq.is_batch:
                    add_line()
                elif seq.num_output_tokens > 1:
                    run.ttft.append(first[rid] - born[rid])
                    run.tpot.append((now - first[rid]) / (seq.num_output_tokens - 1))
    run.seconds = now
    run.num_batch_preemptions = sched.num_batch_preemptions
    return run


def step_ms(args: argparse.Namespace, chunks: list) -> float:
    """A step's virtual cost: fixed, per decode row, per prompt token."""
    rows = sum(1 for c in chunks if c.num_tokens == 1 and c.start_pos > 0)
    tokens = sum(c.num_tokens for c in chunks) - rows
    row_ms = args.token_ms if args.row_ms is None else args.row_ms
    return args.step_ms + row_ms * rows + args.token_ms * tokens


def request_capacity(args: argparse.Namespace) -> float:
    """Interactive requests/s the engine finishes with interactive work alone, saturated."""
    probe = simulate(args, 50.0, False, 1.0, 0, True)
    return len(probe.ttft) / probe.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="virtual seconds per run")
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--step-ms", type=float, default=15.0, help="a step's fixed cost")
    ap.add_argument("--token-ms", type=float, default=0.6, help="cost per prompt token a step computes")
    ap.add_argument("--row-ms", type=float, default=None, help="cost per decode row (default: --token-ms)")
    ap.add_argument("--budget", type=float, default=0.1, help="latency budget of the bound (0.1: within 10%%)")
    ap.add_argument("--batch-lines", type=int, default=64)
    ap.add_argument("--settings", default="1.0:0,0.25:0,0.1:0,1.0:128,0.1:128,0.1:64",
                    help="batch_max_share:batch_step_tokens[:batch_step_overhead[:nc]], one priority-on run each")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    rate = args.load * request_capacity(args)
    runs: dict[str, Run] = {"interactive only": simulate(args, rate, False, 1.0, 0, True)}
    runs["batch alone"] = simulate(args, 0.0, True, 1.0, 0, True)
    for setting in args.settings.split(","):
        parts = setting.split(":")
        share, step_tokens = parts[:2]
        overhead, flags = (parts[2] if len(parts) > 2 else "0"), (parts[3] if len(parts) > 3 else "")
        name = f"on, {share}:{step_tokens}" + (f", overhead {overhead}" if float(overhead) else "")
        name += ", no credit" if "nc" in flags else ""
        runs[name] = simulate(args, rate, True, float(share), int(step_tokens), True, float(overhead), flags)
    runs["off (first come)"] = simulate(args, rate, True, 1.0, 0, False)
    report(args, rate, runs)


def idle_bound(args: argparse.Namespace, runs: dict[str, Run], capacity: float) -> tuple[float, float, float]:
    """(f, the batch tok/s bound, the bound on "idle used"). f: the share of time the engine computes
    interactive work when it runs alone. In interactive steps a batch gets at most ``--budget`` of their
    time, at its marginal cost per generated token (its prompt and decode tokens, no fixed cost: the
    step pays that); more would lengthen them by more than the budget. That budget lengthens them, so
    interactive work then holds the engine ``f * (1 + budget)`` of the time, and the batch gets the
    rest at its batch-alone rate. An estimate, not a theorem: a p95 tolerates more in a few steps."""
    alone, batch = runs["interactive only"], runs["batch alone"]
    f = alone.interactive_s / alone.seconds
    row_ms = args.token_ms if args.row_ms is None else args.row_ms
    mean_prompt, mean_answer = (16 + 384) / 2, (8 + 96) / 2
    marginal_ms = (mean_prompt * args.token_ms + mean_answer * row_ms) / mean_answer
    busy = min(1.0, f * (1 + args.budget))
    bound = (1 - busy) * batch.batch_tokens / batch.seconds + args.budget * f * 1000 / marginal_ms
    return f, bound, min(1.0, bound / (capacity - alone.interactive_tokens / alone.seconds))


def report(args: argparse.Namespace, rate: float, runs: dict[str, Run]) -> None:
    tps = {k: (r.interactive_tokens / r.seconds, r.batch_tokens / r.seconds) for k, r in runs.items()}
    capacity = max(a + b for a, b in tps.values())
    alone = runs["interactive only"]
    f, bound, bound_used = idle_bound(args, runs, capacity)
    idle_time_tps = (1 - f) * tps["batch alone"][1]  # the batch-alone rate over the time nothing interactive runs
    row_ms = args.token_ms if args.row_ms is None else args.row_ms
    print(
        f"virtual time, {args.step_ms} ms + {row_ms} ms/decode row + {args.token_ms} ms/prompt token a step; "
        f"interactive {rate:.2f} req/s ({args.load:.0%} of capacity); capacity {capacity:.0f} generated tok/s "
        f"(the most any run made); interactive work {f:.0%} of the time alone"
    )
    head = (
        f"{'run':<40}{'TTFT p95':>10}{'vs alone':>9}{'TPOT p95':>10}{'vs alone':>9}{'batch tok/s':>12}"
        f"{'idle used':>10}{'idle time':>10}{'preempt':>9}"
    )
    print(head)
    print("-" * len(head))
    for name, r in runs.items():
        inter, btps = tps[name]
        idle = capacity - inter
        used = f"{btps / idle:.0%}" if r.batch_tokens and idle > 0 else "-"
        used_time = f"{btps / idle_time_tps:.0%}" if r.batch_tokens and name != "batch alone" else "-"
        ttft, tpot = pct(r.ttft, 95), pct(r.tpot, 95)
        base_ttft, base_tpot = pct(alone.ttft, 95), pct(alone.tpot, 95)
        print(
            f"{name:<40}{ttft * 1000:>8.0f}ms{ttft / base_ttft:>8.2f}x{tpot * 1000:>8.1f}ms{tpot / base_tpot:>8.2f}x"
            f"{btps:>12.0f}{used:>10}{used_time:>10}{r.num_batch_preemptions:>9}"
        )
    print(
        f"bound with both latencies within {args.budget:.0%}: about {bound:.0f} batch tok/s, {bound_used:.0%} of the "
        f"idle capacity (idle used); idle time: the batch over its batch-alone rate times the {1 - f:.0%} of the "
        "time interactive work leaves the engine empty"
    )


if __name__ == "__main__":
    main()
