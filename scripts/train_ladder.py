"""Train the task-trained model ladder: ``ladder-small`` (~1.4M) and ``ladder-large`` (~8M).

Both start from the ShareGPT-pretrained demo checkpoints (``draft`` and ``target``: same
tokenizer and chat template) and are fine-tuned, offline on CPU, on the same mix of
checkable task suites (``tokenops_plugins.multi_model._suites``, training seeds only;
the held-out seed-0 prompts are excluded) plus ShareGPT first exchanges, with the loss on
the answer only. The two get the same data and the same number of steps, so what differs
is the size. Held-out accuracy per dimension (Wilson 95%) goes into
``tokenops/demo_models/ladder_report.json``.

    nice -n 10 .venv/bin/python scripts/train_ladder.py                     # time budgets
    nice -n 10 .venv/bin/python scripts/train_ladder.py --steps-small N --steps-large N
    .venv/bin/python scripts/train_ladder.py --report-only                  # re-measure saved folders
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from task_training import (FinetuneConfig, chat_pairs, finetune, heldout_prompts, recall_pairs,  # noqa: E402
                           suite_accuracy, task_pairs, HELDOUT_SEED)
from train_demo_models import DEFAULT_OUT, load_conversations, save_model, split_data, to_messages  # noqa: E402

LADDER = {"large": "target", "small": "draft"}  # trained in this order  # ladder model -> checkpoint it starts from
MIX = {"math": 0.24, "code": 0.2, "retrieval": 0.14, "extraction": 0.12, "instruction": 0.12, "classification": 0.10}
CHAT_SHARE = 0.05


def load_start(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def evaluate(out: Path, names: list[str], n: int) -> dict:
    from tokenizers import Tokenizer

    from tokenops_plugins.multi_model._suites import DIMENSIONS, make_suite

    tasks = [t for d in DIMENSIONS for t in make_suite(d, n, HELDOUT_SEED)]
    figures = {}
    for name in names:
        folder = out / f"ladder-{name}"
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        started = time.perf_counter()
        figures[name] = suite_accuracy(load_start(folder).eval(), tok, tasks)
        print(f"== eval ladder-{name} ({time.perf_counter() - started:.0f}s): " + ", ".join(
            f"{d} {v['accuracy']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}]" for d, v in figures[name].items()),
            flush=True)
    return figures


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--start", type=Path, default=DEFAULT_OUT, help="folder holding the draft/target checkpoints")
    p.add_argument("--models", default="small,large")
    p.add_argument("--resume", action="store_true",
                   help="continue from the saved ladder folders in --out (a further phase; use another --seed "
                        "for fresh task pairs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mix", default=None,
                   help="dimension weights for this phase, e.g. 'retrieval=0.5,math=0.1,...' (default: MIX)")
    p.add_argument("--recall-share", type=float, default=0.0,
                   help="share of the retrieval pairs drawn from the varied recall generator "
                        "(task_training.recall_pair: several keys, distractors, multi-turn) instead of the suite")
    p.add_argument("--recall-variant", choices=("short", "long"), default="short",
                   help="short: task_training.recall_pair (<= ~230 tokens); long: recall_training.long_recall_pair "
                        "(up to --max-len tokens, 4 layouts incl. recalled-memory and system-prompt facts)")
    p.add_argument("--examples", type=int, default=40_000, help="training pairs generated (epochs reshuffle)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-len", type=int, default=192)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=False,
                   help="bf16 autocast (only faster on CPUs with AMX/AVX512-BF16)")
    p.add_argument("--eval-n", type=int, default=100, help="held-out tasks per dimension (seed 0)")
    p.add_argument("--report-only", action="store_true")
    for name, minutes, lr in (("small", 5.0, 3e-3), ("large", 14.0, 1.5e-3)):
        p.add_argument(f"--minutes-{name}", type=float, default=minutes)
        p.add_argument(f"--steps-{name}", type=int, default=None,
                       help="exact steps" + (" (default: as many as the large model took, same data)"
                                             if name == "small" else ""))
        p.add_argument(f"--lr-{name}", type=float, default=lr)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    names = [n for n in LADDER if n in {m.strip() for m in args.models.split(",")}]
    assert all(n in LADDER for n in names), names
    report_path = args.out / "ladder_report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {"models": {}}
    if not args.report_only:
        from tokenizers import Tokenizer

        excluded = heldout_prompts()
        num_chat = int(args.examples * CHAT_SHARE)
        mix = dict(MIX) if args.mix is None else {k: float(v) for k, v in
                                                  (item.split("=") for item in args.mix.split(","))}
        num_tasks = args.examples - num_chat
        num_recall = int(num_tasks * mix.get("retrieval", 0) / sum(mix.values()) * args.recall_share)
        suite_mix = {d: w * (1 - args.recall_share) if d == "retrieval" else w for d, w in mix.items()}
        pairs = task_pairs(suite_mix, num_tasks - num_recall, args.seed, excluded)
        if num_recall and args.recall_variant == "long":
            from tokenizers import Tokenizer as _Tok

            from recall_training import long_recall_pairs
            from task_training import prompt_text

            _tok = _Tok.from_file(str(args.start / "target" / "tokenizer.json"))
            limit = args.max_len - 8  # room for the answer: a pair is never cut

            pairs += long_recall_pairs(num_recall, args.seed,
                                       lambda m: len(_tok.encode(prompt_text(m), add_special_tokens=False).ids) <= limit)
        elif num_recall:
            pairs += recall_pairs(num_recall, args.seed, excluded)
        _, train_convs, _ = split_data(load_conversations(), 0, 400, 2_000_000)
        pairs += chat_pairs(train_convs, num_chat, max_chars=300)
        print(f"== {len(pairs)} training pairs ({num_chat} ShareGPT first exchanges); "
              f"{len(excluded)} held-out prompts excluded", flush=True)
        for name in names:
            start = args.out / f"ladder-{name}" if args.resume else args.start / LADDER[name]
            tok = Tokenizer.from_file(str(start / "tokenizer.json"))
            model = load_start(start)
            steps = getattr(args, f"steps_{name}")
            if name == "small" and steps is None and "ladder-large" in report["models"]:
                steps = report["models"]["ladder-large"]["num_steps"]
            cfg = FinetuneConfig(lr=getattr(args, f"lr_{name}"), batch_size=args.batch_size, max_len=args.max_len,
                                 steps=steps, minutes=getattr(args, f"minutes_{name}"), seed=args.seed, bf16=args.bf16)
            info = finetune(model, tok, pairs, cfg, name=name, log=lambda s: print(s, flush=True))
            save_model(model, args.out / f"ladder-{name}", start)
            info |= {"num_params": sum(p.numel() for p in model.parameters()),
                     "started_from": f"ladder-{name}" if args.resume else LADDER[name],
                     "mix": mix, "recall_share": args.recall_share, "recall_variant": args.recall_variant, "chat_share": CHAT_SHARE, "examples_generated": len(pairs), "threads": args.threads}
            previous = report["models"].get(f"ladder-{name}") if args.resume else None
            if previous is not None:  # one entry per phase; the totals cover them all
                phases = previous.get("phases") or [{k: v for k, v in previous.items() if k != "phases"}]
                info["phases"] = phases + [dict(info)]
                info["started_from"] = phases[0].get("started_from", LADDER[name])
                for key in ("num_steps", "examples_seen"):
                    info[key] = sum(ph[key] for ph in info["phases"])
                info["train_minutes"] = round(sum(ph["train_minutes"] for ph in info["phases"]), 2)
            report["models"][f"ladder-{name}"] = info
            report_path.write_text(json.dumps(report, indent=2) + "\n")
            print(f"== ladder-{name}: {info['num_steps']} steps in {info['train_minutes']} min "
                  f"(reproduce: --steps-{name} {info['num_steps']})", flush=True)
    report["heldout"] = {"seed": HELDOUT_SEED, "per_dimension": args.eval_n,
                         "accuracy": evaluate(args.out, [n for n in LADDER if (args.out / f"ladder-{n}").is_dir()],
                                              args.eval_n)}
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"== report in {report_path}", flush=True)


if __name__ == "__main__":
    main()
