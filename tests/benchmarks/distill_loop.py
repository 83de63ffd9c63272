"""The distillation loop end to end, on the layer-1 ladder (issue 21).

1. ``tokenops serve`` (a real subprocess, ``ServeProcess``) serves ``ladder-large`` with
   ``[plugins.distill_capture]`` on for tenant ``bench``; ``--requests`` prompts of the
   ladder's task mix (training seeds, never the held-out seed-0 suites) go through it with
   the openai SDK; the teacher's answers land in the store.
2. ``tokenops distill train --teacher ladder-large --student ladder-small`` (a subprocess,
   the real command) fine-tunes the student on the captured pairs (answers + logit KD).
3. Student before/after and teacher on the held-out suites of the teacher's strong
   dimensions (gap recovered = (after - before) / (teacher - before), summed over those
   dimensions), and the bundled engine's draft acceptance (student drafting for the
   teacher, k=4, greedy) on held-out suite prompts, before/after.

    nice -n 10 .venv/bin/python tests/benchmarks/distill_loop.py                  # 4,000 requests, 250 steps
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

STRONG = ["extraction", "code", "instruction"]  # ladder-large > ladder-small there before small's phase 7 (docs/distillation.md)


def config_text(large: Path) -> str:
    return f"""
[[models]]
name = "ladder-large"
path = "{large}"

[gateway]
api_keys = {{ "bench-key" = "bench" }}

[plugins.distill_capture]
models = ["ladder-large"]
tenants = ["bench"]
"""


def capture(workdir: Path, num: int, seed: int, concurrency: int) -> tuple[Path, float]:
    import openai
    from task_training import MAX_NEW_TOKENS, heldout_prompts, task_pairs
    from train_ladder import MIX

    from tokenops.testing_serve import ServeProcess

    pairs = task_pairs(MIX, num, seed=100 + seed, exclude=heldout_prompts())
    with ServeProcess(workdir, config=config_text(REPO / "tokenops" / "demo_models" / "ladder-large")) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="bench-key")

        def ask(pair):
            dim, prompt, _ = pair
            client.chat.completions.create(model="ladder-large", temperature=0, max_tokens=MAX_NEW_TOKENS.get(dim, 12),
                                           messages=[{"role": "user", "content": prompt}])

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(ask, pairs))
        seconds = time.perf_counter() - started
        store_path = srv.store_path
    return store_path, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--kd-weight", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-n", type=int, default=50, help="held-out suite tasks per strong dimension")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--store", type=Path, default=None, help="reuse a store captured by an earlier run (skips capture)")
    p.add_argument("--resume", action="store_true", help="continue the training run in WORKDIR (its checkpoint.pt)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the training subprocess")
    p.add_argument("--min-confidence", type=float, default=None,
                   help="passed to distill train: keep pairs whose teacher confidence >= P (docs/distillation.md)")
    p.add_argument("--keep-truncated", action="store_true", help="passed to distill train")
    p.add_argument("--replay-dropped", action="store_true", help="passed to distill train")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from task_training import HELDOUT_SEED

    from tokenops_plugins.distill._evaluation import draft_acceptance, suite_figures
    from tokenops_plugins.distill._kd import resolve_model
    from tokenops_plugins.multi_model._suites import make_suite

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="distill-loop-"))
    t0 = time.perf_counter()
    if args.store is None:
        store_path, capture_s = capture(workdir, args.requests, args.seed, args.concurrency)
        print(f"== captured {args.requests} teacher answers through tokenops serve in {capture_s:.0f}s", flush=True)
    else:
        store_path, capture_s = args.store, None
        print(f"== reusing the pairs captured in {store_path}", flush=True)
    out = workdir / "distilled" / "ladder-small-distilled"
    cmd = [sys.executable, "-m", "tokenops", "distill", "train", "--teacher", "ladder-large", "--student", "ladder-small",
           "--store", str(store_path), "--out", str(out), "--steps", str(args.steps), "--kd-weight", str(args.kd_weight),
           "--lr", str(args.lr), "--heldout", "0", "--json"] + (["--resume"] if args.resume else [])
    cmd += (["--min-confidence", str(args.min_confidence)] if args.min_confidence is not None else []) + \
        (["--keep-truncated"] if args.keep_truncated else []) + (["--replay-dropped"] if args.replay_dropped else [])
    started = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TOKENOPS_DEBUG="1", OMP_NUM_THREADS=str(args.threads)))
    if res.returncode != 0:
        sys.exit(f"distill train failed:\n{res.stderr[-3000:]}")
    info = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"== distill train: {info['steps']} steps on {info['pairs']} pairs, logit KD {info['logit_kd']}, "
          f"{time.perf_counter() - started:.0f}s; filter: {info.get('filter')}", flush=True)

    folders = {"before": resolve_model("ladder-small"), "after": out, "teacher": resolve_model("ladder-large")}
    suites = {k: {d: v["accuracy"] for d, v in suite_figures(f, STRONG, args.eval_n).items()} for k, f in folders.items()}
    gap = sum(suites["teacher"][d] - suites["before"][d] for d in STRONG)
    gained = sum(suites["after"][d] - suites["before"][d] for d in STRONG)
    prompts = [t.prompt for d in STRONG for t in make_suite(d, 8, HELDOUT_SEED)]
    acc = {k: draft_acceptance(folders["teacher"], folders[k], prompts) for k in ("before", "after")}
    print(f"\n{'model':10s}" + "".join(f"{d:>13s}" for d in STRONG) + f"{'draft acc.':>13s}")
    for k in ("before", "after", "teacher"):
        a = f"{acc[k]['acceptance_rate']:13.2f}" if k in acc else f"{'-':>13s}"
        print(f"{k:10s}" + "".join(f"{suites[k][d]:13.2f}" for d in STRONG) + a)
    recovered = gained / gap if gap > 0 else float("nan")
    print(f"\ngap recovered on {'+'.join(STRONG)} (held-out seed 0, n={args.eval_n} each): {100 * recovered:.0f}% "
          f"(goal >= 50%)")
    print(f"draft acceptance (k=4, greedy, {len(prompts)} held-out prompts): {acc['before']['acceptance_rate']:.2f} -> "
          f"{acc['after']['acceptance_rate']:.2f} ({acc['after']['acceptance_rate'] - acc['before']['acceptance_rate']:+.2f}"
          f", goal +0.10)")
    print(f"total {(time.perf_counter() - t0) / 60:.1f} min (shared 2-core machine: times are disturbed by other work)")
    if args.json:
        args.json.write_text(json.dumps({"suites": suites, "acceptance": acc, "gap_recovered": recovered,
                                         "train": info, "requests": args.requests, "capture_s": capture_s}, indent=2))


if __name__ == "__main__":
    main()
