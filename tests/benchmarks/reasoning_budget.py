"""Budget–accuracy curve of the demo reasoning model (``reasoning-small``) on held-out items.

For fixed thinking budgets, unlimited thinking, reflection suppression ("Wait" masked
while thinking) and the difficulty-adaptive policy, prints accuracy (Wilson 95%), mean
thinking tokens, and completion tokens per correct answer, on the held-out (seed 0)
multi-step suites. The engine runs in-process with the same budget forcing the server
uses (``tokenops.backends.reasoning_control.thinking_control``).

The adaptive policy is first learned by a calibration run on other items (seed 7;
training used seeds >= 1000): per (predicted dimension, prompt length) a budget of a grid,
the smallest that loses no calibration item, then smaller ones where they save the most
thinking per item lost while the calibration accuracy stays within ``--tolerance``. The
table is written where the ``reasoning_budget`` plugin reads it
(``profiles/reasoning/<model>.json``) unless ``--no-write``.

The traffic-learned policy needs no ground truth: the calibration items sent with
unlimited thinking stand for recorded traffic; of each request the engine's telemetry
(the block closed by the model, its first-pass length) and the prompt's features are kept,
exactly what the server records in ``requests.decisions``, and
``_traffic_budget.learn_from_traffic`` (what ``tokenops reasoning learn`` runs on the
store) turns them into a table: per group the smallest budget that leaves ``--coverage`` of
its traffic whole (stopped right after the first pass, or not at all).

Goal (issue 19): adaptive within 2 points of unlimited accuracy with >= 40% fewer
thinking tokens (checked for both adaptive policies).

    nice -n 10 .venv/bin/python tests/benchmarks/reasoning_budget.py            # 100 per suite
    nice -n 10 .venv/bin/python tests/benchmarks/reasoning_budget.py --n 40 --calibration-n 40
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = "tokenops-reasoning-small"
GRID = (0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 64)


def build_engine(path: Path, threads: int):
    import torch

    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine

    torch.set_num_threads(threads)
    return LLMEngine(EngineConfig(model=str(path), model_name=MODEL, max_num_seqs=64, max_num_batched_tokens=2048,
                                  kv_cache_tokens=65536))


def run(engine, tasks, budget_for, suppress=(), max_tokens=200) -> list[dict]:
    """Answer ``tasks`` greedily, each under ``budget_for(task)``; one dict per task."""
    from tokenops.backends.reasoning_control import thinking_control
    from tokenops.engine.sampling.sampling import SamplingParams
    from tokenops.types import ReasoningBudget

    tok = engine.tokenizer
    prompts, params = [], []
    for t in tasks:
        text = tok.apply_chat_template([{"role": "user", "content": t.prompt}], add_generation_prompt=True)
        prompts.append(tok.encode(text, add_special_tokens=False))
        control = thinking_control(tok, "<think>", "</think>", ReasoningBudget(budget_for(t), tuple(suppress)))
        params.append(SamplingParams(temperature=0, max_tokens=max_tokens, thinking=control))
    outs = engine.generate(prompts, params)
    return [{"correct": bool(t.check(o.outputs[0].text)), "thinking": o.outputs[0].num_reasoning_tokens,
             "tokens": len(o.outputs[0].token_ids), "closed_by": o.outputs[0].thinking_closed_by,
             "first_pass": o.outputs[0].thinking_first_pass, "spent": o.outputs[0].thinking_spent}
            for t, o in zip(tasks, outs)]


def summary(name: str, rows: list[dict]) -> dict:
    from tokenops_plugins.multi_model._profiles import wilson

    n, correct = len(rows), sum(r["correct"] for r in rows)
    lo, hi = wilson(correct, n)
    return {"config": name, "accuracy": correct / n, "ci": [round(lo, 3), round(hi, 3)], "n": n,
            "mean_thinking_tokens": sum(r["thinking"] for r in rows) / n,
            "tokens_per_correct": sum(r["tokens"] for r in rows) / max(correct, 1)}


def calibrate(engine, tasks, tolerance: float):
    """Learn the adaptive table; a budget at or above an item's unlimited thinking changes
    nothing (greedy), so only the items that would be cut are re-run per budget."""
    from tokenops_plugins.model_optimization._adaptive_budget import learn

    full = run(engine, tasks, lambda t: None)
    results = [{None: r["correct"]} for r in full]
    for b in GRID:
        cut = [i for i, r in enumerate(full) if r["thinking"] > b + 1]  # +1: the <think> tag
        for i, r in zip(cut, run(engine, [tasks[i] for i in cut], lambda t, b=b: b)):
            results[i][b] = r["correct"]
        for i, r in enumerate(full):
            results[i].setdefault(b, r["correct"])
    return learn([(t.prompt, r, f["thinking"]) for t, r, f in zip(tasks, results, full)], tolerance=tolerance), full


def learn_traffic(tasks, unlimited_rows, coverage: float, min_items: int):
    """The traffic-learned table from unlimited answers (no correctness used)."""
    from tokenops_plugins.model_optimization._adaptive_budget import features
    from tokenops_plugins.model_optimization._traffic_budget import TrafficSample, learn_from_traffic

    samples = [TrafficSample(*features(t.prompt), r["first_pass"], r["spent"]) for t, r in zip(tasks, unlimited_rows)
               if r["closed_by"] == "model" and r["first_pass"] is not None]
    return learn_from_traffic(samples, coverage, min_items)


def terms_table(tasks, per_item: dict[str, list[dict]]) -> dict[str, dict[int, float]]:
    """Multistep accuracy per number of terms, per config (prints it): where a budget cuts
    the first pass of the longer chains."""
    terms = sorted({t.difficulty for t in tasks if t.dimension == "multistep"})
    print(f"\nmultistep accuracy by number of terms (items per column: "
          f"{[sum(t.dimension == 'multistep' and t.difficulty == k for t in tasks) for k in terms]})")
    print(f"{'config':28} " + " ".join(f"{k:>6}" for k in terms))
    out = {}
    for name, items in per_item.items():
        acc = {}
        for k in terms:
            rows = [r for t, r in zip(tasks, items) if t.dimension == "multistep" and t.difficulty == k]
            acc[k] = sum(r["correct"] for r in rows) / max(len(rows), 1)
        out[name] = acc
        print(f"{name:28} " + " ".join(f"{acc[k]:6.2f}" for k in terms))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=REPO / "tokenops" / "demo_models" / "reasoning-small")
    p.add_argument("--n", type=int, default=100, help="held-out items per suite (seed 0)")
    p.add_argument("--calibration-n", type=int, default=100, help="calibration items per suite (seed 7)")
    p.add_argument("--tolerance", type=float, default=0.01,
                   help="calibration accuracy the adaptive table may give up in all (half the goal's 2 points)")
    p.add_argument("--budgets", default="0,8,16,32,64")
    p.add_argument("--coverage", type=float, default=0.95,
                   help="traffic-learned policy: share of a group's traffic its budget must leave whole")
    p.add_argument("--min-items", type=int, default=5, help="traffic-learned policy: smallest group given a budget")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tokenops_plugins.model_optimization._reasoning_tasks import REASONING_DIMENSIONS, make_reasoning_suite

    engine = build_engine(args.model, args.threads)
    started = time.perf_counter()
    calib = [t for d in REASONING_DIMENSIONS for t in make_reasoning_suite(d, args.calibration_n, seed=7)]
    table, traffic_rows = calibrate(engine, calib, args.tolerance)
    traffic_table = learn_traffic(calib, traffic_rows, args.coverage, args.min_items)
    table.meta.update({"model": MODEL, "calibration": {"seed": 7, "per_suite": args.calibration_n}, "grid": GRID})
    if not args.no_write:
        out = REPO / "profiles" / "reasoning" / f"{MODEL}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(table.to_json(), indent=2) + "\n")
    print(f"calibration: {len(calib)} items in {time.perf_counter() - started:.0f}s; table "
          + json.dumps(table.to_json()["budgets"]), flush=True)
    print(f"traffic-learned (coverage {args.coverage}, from the same items sent unlimited, no ground truth): table "
          + json.dumps(traffic_table.to_json()["budgets"]), flush=True)

    heldout = [t for d in REASONING_DIMENSIONS for t in make_reasoning_suite(d, args.n, seed=0)]
    configs = [(f"budget {b}", (lambda t, b=b: b), ()) for b in map(int, args.budgets.split(","))]
    configs += [("unlimited", lambda t: None, ()), ("unlimited, Wait suppressed", lambda t: None, ("Wait",)),
                ("adaptive", lambda t: table.budget_for(t.prompt)[0], ()),
                ("adaptive, Wait suppressed", lambda t: table.budget_for(t.prompt)[0], ("Wait",)),
                ("traffic-learned", lambda t: traffic_table.budget_for(t.prompt)[0], ()),
                ("traffic-learned, Wait suppr.", lambda t: traffic_table.budget_for(t.prompt)[0], ("Wait",))]
    per_item = {name: run(engine, heldout, fn, suppress) for name, fn, suppress in configs}
    rows = [summary(name, items) for name, items in per_item.items()]
    full = next(r for r in rows if r["config"] == "unlimited")
    print(f"\nreasoning-small, held-out seed 0, {len(heldout)} items ({args.n} per suite: "
          f"{', '.join(REASONING_DIMENSIONS)}), greedy, engine in-process (CPU, {args.threads} thread)")
    print(f"{'config':28} {'accuracy':>9} {'95% CI':>14} {'thinking tok':>13} {'tok/correct':>12}")
    for r in rows:
        print(f"{r['config']:28} {r['accuracy']:9.3f} {str(r['ci']):>14} {r['mean_thinking_tokens']:13.1f} "
              f"{r['tokens_per_correct']:12.1f}")
    by_terms = terms_table(heldout, per_item)
    goals = {}
    print()
    for r in rows:
        if not r["config"].startswith(("adaptive", "traffic")):
            continue
        saved = 1 - r["mean_thinking_tokens"] / full["mean_thinking_tokens"] if full["mean_thinking_tokens"] else 0.0
        drop = full["accuracy"] - r["accuracy"]
        ok = drop <= 0.02 and saved >= 0.40
        goals[r["config"]] = {"saving": saved, "accuracy_drop": drop, "goal_met": ok}
        print(f"{r['config']} vs unlimited: accuracy {-drop * 100:+.1f} points, thinking tokens -{saved * 100:.0f}% "
              f"-> goal (<= 2 points lost, >= 40% fewer) {'MET' if ok else 'NOT met'}")
    if args.json:
        print(json.dumps({"rows": rows, "goals": goals, "multistep_by_terms": by_terms,
                          "traffic_table": traffic_table.to_json()}))


if __name__ == "__main__":
    main()
