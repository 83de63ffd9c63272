"""Idle-priority scheduling on the default model (SmolLM2-135M GGUF): does a batch use the capacity
interactive traffic leaves idle without slowing that traffic down?

One ``tokenops serve`` (bundled engine, ``max_num_seqs`` 16). First the engine's capacity: the
interactive shape's requests/s in a closed loop at 16 in flight, and the generated tokens/s of a
batch alone filling the engine. Then interactive traffic, ShareGPT-shaped, Poisson at ``--load``
(0.5) of that request rate for ``--seconds``, three kinds of run (``--repeat`` times each, in turn;
the table shows medians):

- alone;
- with a batch of ``--batch-lines`` ShareGPT-shaped lines submitted through the Batch API
  (POST /v1/files + /v1/batches) at the same moment, priority classes on;
- the same with priority classes off (``engine.priority_classes = false``, live: one first-come queue).

For each run: interactive TTFT p95 and TPOT p95, the batch's output tokens/s during the run (the
engine's generated tokens minus the interactive ones) and the share of the idle capacity it took:
batch tokens/s over (capacity - that run's interactive tokens/s), where capacity is the most generated
tokens/s the engine made in the invocation (a batch alone, or any run with both classes), so the share
is never above 100%. The goal: priority on keeps
TTFT/TPOT p95 within 10% of interactive-only while the batch takes >= 80% of the idle capacity.
The batch is cancelled after each run (the next starts on an idle engine). Every run sends the same
seeded prompts tagged with a run number (fresh prompts: no run finds its prompts in the prefix cache an
earlier run warmed, which gave the runs after the first a TTFT p95 a quarter of interactive-only's).

    .venv/bin/python tests/benchmarks/batch_priority.py [--seconds 60] [--load 0.5] [--share 1.0]
        [--step-tokens 0[,64[:overhead[:share]]...]] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tokenops.bench.arrivals import ArrivalSpec  # noqa: E402
from tokenops.bench.loadgen import LoadSpec, run_load  # noqa: E402
from tokenops.bench.metrics import metric_values, percentile  # noqa: E402
from tokenops.bench.sharegpt import sharegpt  # noqa: E402
from tokenops.testing_serve import ServeProcess  # noqa: E402

MODEL = "smollm2"
MAX_NUM_SEQS = 16
SHAPE = {"max_input_len": 384, "max_output_len": 96, "min_output_len": 8}
RUNS = itertools.count(1)  # tags each run's prompts (fresh())


def server_config(gguf: str, share: float, step_tokens: int = 0) -> str:
    return (
        f'[[models]]\nname = "{MODEL}"\nbackend = "local"\npath = "{gguf}"\n'
        f"engine = {{ max_num_seqs = {MAX_NUM_SEQS}, batch_max_share = {share}, batch_step_tokens = {step_tokens} }}\n\n"
        "[batches]\nmax_in_flight = 64\n"
    )


def engine_stats(srv: ServeProcess) -> dict[str, Any]:
    import httpx

    engines = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=60).json()["engines"]
    return next(iter(engines.values()))


def set_priority_classes(srv: ServeProcess, on: bool, setting: tuple[int, float, float | None] | None = None) -> None:
    """Priority classes on or off; ``setting``: (``batch_step_tokens``, ``batch_step_overhead``,
    ``batch_max_share`` or None: as the server started)."""
    import httpx

    values: dict[str, Any] = {"engine.priority_classes": on}
    if setting is not None:
        values["engine.batch_step_tokens"], values["engine.batch_step_overhead"], share = setting
        if share is not None:
            values["engine.batch_max_share"] = share
    r = httpx.patch(srv.url + "/admin/tunables", headers=srv.admin_headers, json={"values": values}, timeout=60)
    r.raise_for_status()


def wait_idle(srv: ServeProcess, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while (s := engine_stats(srv))["num_running"] or s["num_waiting"]:
        assert time.monotonic() < deadline, f"the engine did not drain: {s}"
        time.sleep(0.5)


async def request_capacity(srv: ServeProcess, seconds: float) -> float:
    """Requests/s of the interactive shape with ``MAX_NUM_SEQS`` requests always in flight."""
    num = max(2 * MAX_NUM_SEQS, int(seconds * 2))
    spec = LoadSpec(srv.url, MODEL, concurrency=MAX_NUM_SEQS, ignore_eos=True, ramp_up_s=2.0)
    results, duration = await run_load(fresh(sharegpt(num, seed=1, **SHAPE), f"request {next(RUNS)}"), spec)
    return sum(1 for r in results if r.is_ok) / duration


def token_capacity(srv: ServeProcess, seconds: float, lines: int) -> tuple[float, float]:
    """Generated tokens/s of the engine saturated by a batch alone (what there is to share), and the
    seconds a batch token adds to a shared step (:func:`marginal_s`)."""
    import openai

    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
    batch_id = submit_batch(srv, lines)
    deadline = time.monotonic() + 600
    # steady state: the first wave of prompts (all prefill, few generated tokens) is done
    while (counts := client.batches.retrieve(batch_id).request_counts) is None or counts.completed < MAX_NUM_SEQS:
        assert time.monotonic() < deadline, "the batch did not reach a steady state"
        time.sleep(0.2)
    start, generated0 = time.monotonic(), engine_stats(srv)["total_generation_tokens"]
    time.sleep(seconds)
    stats = engine_stats(srv)
    tps = (stats["total_generation_tokens"] - generated0) / (time.monotonic() - start)
    stop_batch(srv, batch_id)
    return tps, marginal_s(stats["step_cost"], lines)


def marginal_s(step_cost: list[float], lines: int) -> float:
    """Seconds a batch line's generated token adds to a step it shares, by the engine's step-time fit
    (fixed, per decode row, per prompt token): the line's prompt and decode tokens over its answer,
    no fixed cost (the step pays that)."""
    _, row_s, token_s = step_cost
    reqs = sharegpt(lines, seed=2, **SHAPE)
    prompt, answer = (statistics.mean(getattr(r, k) for r in reqs) for k in ("num_prompt_tokens", "max_tokens"))
    return (prompt * token_s + answer * row_s) / answer


def fresh(requests: list[Any], tag: str) -> list[Any]:
    """``requests`` with ``tag`` before each first message: the same shapes in every run, but no run
    finds its prompts in the prefix cache an earlier run warmed (each run draws the same seeded set)."""
    return [
        dataclasses.replace(r, messages=[{**r.messages[0], "content": f"[{tag}] {r.messages[0]['content']}"},
                                         *r.messages[1:]])
        for r in requests
    ]  # fmt: skip


def submit_batch(srv: ServeProcess, n: int) -> str:
    import openai

    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
    tag = f"batch {next(RUNS)}"
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": req.messages,
                "max_tokens": req.max_tokens,
                "ignore_eos": True,
                "temperature": 0,
            },
        }
        for i, req in enumerate(fresh(sharegpt(n, seed=2, **SHAPE), tag))
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    uploaded = client.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id


def stop_batch(srv: ServeProcess, batch_id: str) -> dict[str, int]:
    import openai

    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
    try:
        client.batches.cancel(batch_id)
    except openai.ConflictError:  # it had finished
        pass
    while (batch := client.batches.retrieve(batch_id)).status not in ("cancelled", "completed", "failed"):
        time.sleep(0.5)
    wait_idle(srv)
    counts = batch.request_counts
    return {"completed": counts.completed if counts else 0, "total": counts.total if counts else 0}


async def interactive_run(srv: ServeProcess, rate: float, seconds: float, batch_lines: int) -> dict[str, Any]:
    num = max(4, int(rate * seconds))
    spec = LoadSpec(srv.url, MODEL, arrival=ArrivalSpec(rate, seed=3), ignore_eos=True)
    requests = fresh(sharegpt(num, seed=4, **SHAPE), f"request {next(RUNS)}")
    before = engine_stats(srv)
    generated0, preempted0 = before["total_generation_tokens"], before["num_batch_preemptions"]
    batch_id = submit_batch(srv, batch_lines) if batch_lines else None
    results, duration = await run_load(requests, spec)
    stats = engine_stats(srv)
    ok = [r for r in results if r.is_ok]
    interactive_tokens = sum(r.num_output_tokens for r in ok)
    batch_tokens = stats["total_generation_tokens"] - generated0 - interactive_tokens
    counts = stop_batch(srv, batch_id) if batch_id else None
    return {
        "num_requests": num,
        "num_errors": len(results) - len(ok),
        "duration_s": round(duration, 2),
        "ttft_p95_s": percentile(metric_values(results, "ttft"), 95),
        "tpot_p95_s": percentile(metric_values(results, "tpot"), 95),
        "interactive_tps": interactive_tokens / duration,
        "batch_tps": batch_tokens / duration,
        "batch_preemptions": stats["num_batch_preemptions"] - preempted0,
        # shares of the run's time the engine computed steps, and steps with interactive work
        "busy": (stats["busy_s"] - before["busy_s"]) / duration,
        "interactive_busy": (stats["interactive_busy_s"] - before["interactive_busy_s"]) / duration,
        "load_avg": os.getloadavg()[0],  # the box's 1-minute load at the run's end (2 cores: above 2 is contention)
        "batch_lines": counts,
    }


def ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def median_runs(repeats: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per run kind, the median of each figure over the repeats (the box is shared: one run is noisy)."""
    out: dict[str, dict[str, Any]] = {}
    for name in repeats[0]:
        rows = [r[name] for r in repeats]
        out[name] = {}
        for k, first in rows[0].items():
            values = [row[k] for row in rows if isinstance(row[k], (int, float))]
            out[name][k] = statistics.median(values) if values and not isinstance(first, dict) else first
    return out


def idle_capacity(cap_tps: float, runs: dict[str, dict[str, Any]]) -> float:
    """What the engine can make, in generated tokens/s: the most it made in this invocation, a batch
    alone or any run with both classes (a batch beside interactive requests can make more than a batch
    alone: the measured capacity is a floor, so the highest figure seen is the honest one)."""
    totals = [r["interactive_tps"] + (r["batch_tps"] if r["batch_lines"] else 0.0) for r in runs.values()]
    return max([cap_tps, *totals])


def idle_used(capacity: float, run: dict[str, Any]) -> float | None:
    """The share of the capacity this run's interactive traffic left idle that the batch took: batch
    tokens/s over (capacity - this run's interactive tokens/s). Never above 1: capacity is at least
    this run's total."""
    idle = capacity - run["interactive_tps"]
    return run["batch_tps"] / idle if run["batch_lines"] and idle > 0 else None


def idle_bound(cap_tps: float, marginal: float, alone: dict[str, Any], budget: float = 0.1) -> tuple[float, float]:
    """(the batch tok/s the engine can give a batch with both latencies within ``budget``, about; the
    batch-alone rate over the time interactive work leaves the engine empty). Interactive work holds
    the engine ``f`` of the time (the interactive-only run's steps with it); in those steps a batch may
    add ``budget`` of their time at ``marginal`` seconds a token, and it has the rest of the time, less
    what that adds, at its batch-alone rate. An estimate, not a theorem: a p95 tolerates more in a few
    steps."""
    f = alone["interactive_busy"]
    bound = (1 - min(1.0, f * (1 + budget))) * cap_tps + budget * f / marginal
    return bound, (1 - f) * cap_tps


def print_table(out: dict[str, Any], runs: dict[str, dict[str, Any]]) -> None:
    cap_tps, cap_rps, rate = out["capacity_tps"], out["capacity_rps"], out["rate"]
    alone = runs["interactive only"]
    capacity = idle_capacity(cap_tps, runs)
    bound, idle_time_tps = idle_bound(cap_tps, out["marginal_s"], alone)
    print(
        f"capacity: {capacity:.0f} generated tok/s (the most seen; a batch alone at {MAX_NUM_SEQS} slots: "
        f"{cap_tps:.0f}), {cap_rps:.2f} interactive req/s at {MAX_NUM_SEQS} in flight; interactive at "
        f"{rate:.2f} req/s, in the engine's steps {alone['interactive_busy']:.0%} of the time alone"
    )
    head = (
        f"{'run':<50}{'TTFT p95':>10}{'vs alone':>9}{'TPOT p95':>10}{'vs alone':>9}"
        f"{'inter tok/s':>12}{'batch tok/s':>12}{'total':>7}{'idle used':>10}{'idle time':>10}{'preempt':>8}"
        f"{'busy':>6}{'load':>6}"
    )
    print(head)
    print("-" * len(head))
    for name, r in runs.items():
        ttft, tpot = r["ttft_p95_s"], r["tpot_p95_s"]
        share = idle_used(capacity, r)
        used = "-" if share is None else f"{share:.0%}"
        used_time = f"{r['batch_tps'] / idle_time_tps:.0%}" if r["batch_lines"] and idle_time_tps > 0 else "-"
        print(
            f"{name:<50}{(ttft or math.nan) * 1000:>8.0f}ms{ratio(ttft, alone['ttft_p95_s']):>9}"
            f"{(tpot or math.nan) * 1000:>8.1f}ms{ratio(tpot, alone['tpot_p95_s']):>9}"
            f"{r['interactive_tps']:>12.0f}{(r['batch_tps'] if r['batch_lines'] else 0):>12.0f}"
            f"{r['interactive_tps'] + (r['batch_tps'] if r['batch_lines'] else 0):>7.0f}{used:>10}{used_time:>10}"
            f"{r['batch_preemptions']:>8.0f}{r['busy']:>6.0%}{r.get('load_avg', math.nan):>6.1f}"
        )
    idle = capacity - alone["interactive_tps"]
    print(
        f"bound with both latencies within 10%: about {bound:.0f} batch tok/s, {min(1.0, bound / idle):.0%} of the idle "
        f"capacity (a batch token adds {out['marginal_s'] * 1000:.2f} ms to a step it shares, by the engine's fit); "
        f"idle time: the batch over its batch-alone rate times the {1 - alone['interactive_busy']:.0%} of the time "
        "interactive work leaves the engine empty; busy: the share of the run the engine computed steps"
    )


async def bench(srv: ServeProcess, args: argparse.Namespace) -> dict[str, Any]:
    await request_capacity(srv, 10)  # warm-up: weights paged in, prefix cache and allocator settled
    cap_rps = await request_capacity(srv, args.seconds / 2)
    wait_idle(srv)
    cap_tps, marginal = token_capacity(srv, args.seconds, 8 * MAX_NUM_SEQS)
    rate = args.load * cap_rps
    lines = args.batch_lines or int(2 * cap_tps * args.seconds / SHAPE["max_output_len"]) + MAX_NUM_SEQS
    repeats = []
    for _ in range(args.repeat):  # the three kinds in turn, so the box's load drifts over all of them
        runs: dict[str, dict[str, Any]] = {}
        runs["interactive only"] = await interactive_run(srv, rate, args.seconds, 0)
        for setting in args.step_tokens:  # live: the same server, the same capacity, in turn
            set_priority_classes(srv, True, (setting[0], setting[1], args.share if setting[2] is None else setting[2]))
            name = "+ batch, priority on" + (f", {_setting_name(setting)}" if len(args.step_tokens) > 1 else "")
            runs[name] = await interactive_run(srv, rate, args.seconds, lines)
        set_priority_classes(srv, False)
        runs["+ batch, priority off"] = await interactive_run(srv, rate, args.seconds, lines)
        first = args.step_tokens[0]
        set_priority_classes(srv, True, (first[0], first[1], args.share if first[2] is None else first[2]))
        repeats.append(runs)
    return {
        "capacity_tps": cap_tps,
        "marginal_s": marginal,
        "capacity_rps": cap_rps,
        "rate": rate,
        "batch_lines": lines,
        "runs": median_runs(repeats),
        "repeats": repeats,
    }


def _setting_name(setting: tuple[int, float, float | None]) -> str:
    step_tokens, overhead, share = setting
    return (
        (f"share {share:g}, " if share is not None else "")
        + f"step {step_tokens}"
        + (f", overhead {overhead:g}" if overhead else "")
    )


def _settings(value: str) -> list[tuple[int, float, float | None]]:
    """``64,64:0.1,64:0.1:1.0``: batch_step_tokens, each with an optional batch_step_overhead and
    batch_max_share (else --share's)."""
    out: list[tuple[int, float, float | None]] = []
    for item in value.split(","):
        parts = item.split(":")
        share = float(parts[2]) if len(parts) > 2 else None
        out.append((int(parts[0]), float(parts[1]) if len(parts) > 1 else 0.0, share))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each interactive run")
    ap.add_argument("--load", type=float, default=0.5, help="interactive request rate / measured capacity")
    ap.add_argument("--share", type=float, default=1.0, help="engine batch_max_share")
    ap.add_argument("--step-tokens", type=_settings, default=[(0, 0.0, None)],
                    help="engine batch_step_tokens (0: no bound), each with an optional :batch_step_overhead "
                         "and :batch_max_share (64:0.1:1.0); several, comma-separated: a priority-on run for "
                         "each, set live in turn")  # fmt: skip
    ap.add_argument("--batch-lines", type=int, default=0, help="lines of the batch (0: enough to outlast a run)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each kind (the table shows medians)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from tests import real_model

    with tempfile.TemporaryDirectory() as tmp:
        config = server_config(str(real_model.gguf_path()), args.share, args.step_tokens[0][0])
        with ServeProcess(tmp, config=config, env=real_model.SERVE_ENV) as srv:
            out = asyncio.run(bench(srv, args))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return
    print_table(out, out["runs"])
    for i, runs in enumerate(out["repeats"] if len(out["repeats"]) > 1 else []):
        print(f"\nrepeat {i + 1}:")
        print_table(out, runs)
    done = [
        f"{r['batch_lines']['completed']}/{r['batch_lines']['total']}"
        for rs in out["repeats"]
        for r in rs.values()
        if r["batch_lines"]
    ]
    print(
        f"batch: {out['batch_lines']} lines submitted with each batched run, cancelled after it "
        f"(lines done per run, on/off in turn: {', '.join(done)}); medians of {len(out['repeats'])} repeat(s)"
    )


if __name__ == "__main__":
    main()
