"""Train ``reasoning-small``: the demo ladder's reasoning member.

It starts from the ShareGPT-pretrained ``draft`` checkpoint (the small ladder size) and
is fine-tuned with the ladder's training code (``task_training.finetune``: answer-only
loss, held-out prompts excluded) to write ``<think>`` worked steps ``</think>`` and then
the answer on the multi-step suites of
``tokenops_plugins.model_optimization._reasoning_tasks`` (arithmetic chains and
largest-of-k, 2..6 terms). Like R1-style models it over-thinks: most training answers
re-check the whole computation after a ``Wait, check:`` line, so a thinking budget or
reflection suppression has something to save. ``<think>``, ``</think>`` and ``Wait``
are added to the tokenizer as single (non-special) tokens, as in Qwen3's vocabulary.

    nice -n 10 .venv/bin/python scripts/train_reasoning.py               # ~12 min budget
    nice -n 10 .venv/bin/python scripts/train_reasoning.py --steps N     # exact steps
    .venv/bin/python scripts/train_reasoning.py --report-only            # re-measure the saved folder

Held-out accuracy (seed 0, Wilson 95%) and thinking-token counts go to
``tokenops/demo_models/reasoning-small/training_report.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from task_training import FinetuneConfig, finetune, generate_greedy  # noqa: E402
from train_demo_models import DEFAULT_OUT, save_model  # noqa: E402
from tokenops_plugins.model_optimization._reasoning_tasks import (  # noqa: E402
    REASONING_DIMENSIONS, THINK_CLOSE, THINK_OPEN, make_reasoning_suite)
from tokenops_plugins.multi_model._profiles import wilson  # noqa: E402

NAME = "reasoning-small"
ADDED_TOKENS = (THINK_OPEN, THINK_CLOSE, "Wait")
HELDOUT_SEED, HELDOUT_N = 0, 100


def add_tokens(tok, model) -> None:
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    model.resize_token_embeddings(tok.get_vocab_size(with_added_tokens=True), pad_to_multiple_of=8)


def training_pairs(num: int, seed: int, reflect_share: float,
                   mix: dict[str, float] | None = None) -> list[tuple[str, str, str]]:
    heldout = {t.prompt for d in REASONING_DIMENSIONS for t in make_reasoning_suite(d, HELDOUT_N, HELDOUT_SEED)}
    rng = random.Random(f"reasoning-train:{seed}")
    pairs, suite_seed = [], 1000 + seed
    while len(pairs) < num:
        for dim in REASONING_DIMENSIONS:
            for task in make_reasoning_suite(dim, int(1000 * (mix or {}).get(dim, 0.5)), suite_seed):
                if task.prompt not in heldout:
                    pairs.append((dim, task.prompt, task.completion(reflect=rng.random() < reflect_share)))
        suite_seed += 1
    rng.shuffle(pairs)
    return pairs[:num]


def evaluate(folder: Path, n: int) -> dict:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    result = {}
    for dim in REASONING_DIMENSIONS:
        tasks = make_reasoning_suite(dim, n, HELDOUT_SEED)
        answers = generate_greedy(model, tok, [t.prompt for t in tasks], max_new_tokens=160)
        correct = sum(t.check(a) for t, a in zip(tasks, answers))
        thinking = [len(tok.encode(a.split(THINK_CLOSE)[0], add_special_tokens=False).ids) for a in answers]
        lo, hi = wilson(correct, n)
        result[dim] = {"accuracy": correct / n, "ci_low": round(lo, 3), "ci_high": round(hi, 3), "n": n,
                       "mean_thinking_tokens": round(sum(thinking) / n, 1),
                       "sample": {"prompt": tasks[0].prompt, "answer": answers[0]}}
        print(f"== {dim}: {correct}/{n} [{lo:.2f}, {hi:.2f}], mean thinking tokens {sum(thinking) / n:.1f}",
              flush=True)
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--start", type=Path, default=DEFAULT_OUT / "draft")
    p.add_argument("--examples", type=int, default=60_000)
    p.add_argument("--reflect-share", type=float, default=0.75)
    p.add_argument("--multistep-share", type=float, default=0.5, help="share of arithmetic chains in the pairs")
    p.add_argument("--minutes", type=float, default=12.0)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-n", type=int, default=HELDOUT_N)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--resume", action="store_true", help="continue from the saved folder (a further phase; "
                   "use another --seed for fresh pairs)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = args.out / NAME
    report_path = folder / "training_report.json"
    if not args.report_only:
        from tokenizers import Tokenizer
        from transformers import AutoModelForCausalLM

        start = folder if args.resume else args.start
        tok = Tokenizer.from_file(str(start / "tokenizer.json"))
        model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
        if not args.resume:
            add_tokens(tok, model)
        mix = {"multistep": args.multistep_share, "maxof": 1 - args.multistep_share}
        pairs = training_pairs(args.examples, args.seed, args.reflect_share, mix)
        longest = max(len(tok.encode(a, add_special_tokens=False).ids) for _, _, a in pairs)
        cfg = FinetuneConfig(lr=args.lr, batch_size=args.batch_size, max_len=max(256, 2 * longest + 8),
                             steps=args.steps, minutes=args.minutes, seed=args.seed)
        print(f"== {len(pairs)} pairs, longest answer {longest} tokens", flush=True)
        info = finetune(model, tok, pairs, cfg, name="reasoning", log=lambda s: print(s, flush=True))
        save_model(model, folder, start)
        tok.save(str(folder / "tokenizer.json"))
        info |= {"started_from": NAME if args.resume else "draft", "num_params": sum(q.numel() for q in model.parameters()),
                 "reflect_share": args.reflect_share, "mix": mix, "examples_generated": len(pairs), "threads": args.threads}
        phases = []
        if args.resume and report_path.exists():
            old = json.loads(report_path.read_text()).get("training", {})
            phases = old.get("phases") or [old]
        phases.append(dict(info))
        info["phases"] = phases
        info["num_steps"] = sum(ph["num_steps"] for ph in phases)
        info["train_minutes"] = round(sum(ph["train_minutes"] for ph in phases), 2)
        report_path.write_text(json.dumps({"training": info}, indent=2) + "\n")
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    started = time.perf_counter()
    report["heldout"] = {"seed": HELDOUT_SEED, "per_dimension": args.eval_n, "max_new_tokens": 160,
                         "accuracy": evaluate(folder, args.eval_n)}
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"== eval {time.perf_counter() - started:.0f}s; report in {report_path}", flush=True)


if __name__ == "__main__":
    main()
