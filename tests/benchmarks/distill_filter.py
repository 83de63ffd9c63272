"""Does the teacher's confidence separate its right answers from its wrong ones? (issue 21)

The quality filter of ``tokenops distill`` (``--min-confidence P``, truncated answers
dropped) needs no ground truth: it keeps a captured pair when the teacher's mean token
probability ``exp(mean logprob)`` is at least P. This measures whether that helps, on the
bundled ladder: ``tokenops serve`` (a real subprocess) serves ``ladder-large`` with
``[plugins.distill_capture]`` on; the held-out seed-0 suite prompts of every dimension go
through it with the openai SDK (greedy, the ladder's answer lengths); the captured rows
(answer, finish_reason, mean_logprob, exactly what the filter sees) are then graded by the
suites' checkers. Per dimension it prints the teacher's accuracy, AUROC of confidence for
right-vs-wrong (0.5: no signal, 1: perfect), and for each P the share of pairs kept and the
accuracy of the kept and of the dropped ones; the same for the truncation filter.

    nice -n 10 .venv/bin/python tests/benchmarks/distill_filter.py            # 60 prompts per dimension
    nice -n 10 .venv/bin/python tests/benchmarks/distill_filter.py -n 100 --thresholds 0.6,0.8,0.9
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LARGE = REPO / "tokenops" / "demo_models" / "ladder-large"


def config_text(model: Path, logprobs: bool = True) -> str:
    return f"""
[[models]]
name = "ladder-large"
path = "{model}"

[gateway]
api_keys = {{ "bench-key" = "bench" }}

[plugins.distill_capture]
models = ["ladder-large"]
tenants = ["bench"]
logprobs = {"true" if logprobs else "false"}
"""


def auroc(right: list[float], wrong: list[float]) -> float | None:
    """P(a random right answer is more confident than a random wrong one); ties count half."""
    if not right or not wrong:
        return None
    wins = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong)
    return wins / (len(right) * len(wrong))


def model_version(folder: Path) -> str:
    commit = subprocess.run(["git", "log", "-1", "--format=%h %ad", "--date=short", "--", str(folder)], cwd=REPO,
                            capture_output=True, text=True).stdout.strip() or "uncommitted"
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:12]
    return f"{folder.name} (last commit {commit}; model.safetensors sha256 {digest})"


def capture(workdir: Path, tasks: list, concurrency: int, logprobs: bool = True) -> tuple[list[tuple], float]:
    import openai

    from tokenops.store import open_store
    from tokenops.testing_serve import ServeProcess
    from tokenops_plugins.multi_model._task_training import MAX_NEW_TOKENS

    with ServeProcess(workdir, config=config_text(LARGE, logprobs)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="bench-key")

        def ask(task):
            out = client.chat.completions.create(model="ladder-large", temperature=0,
                                                 max_tokens=MAX_NEW_TOKENS.get(task.dimension, 12),
                                                 messages=[{"role": "user", "content": task.prompt}])
            assert out.choices[0].logprobs is None  # the client did not ask: hidden from it

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(ask, tasks))
        seconds = time.perf_counter() - started
        deadline = time.monotonic() + 60
        while True:
            with open_store(srv.store_path) as s:
                rows = s.execute("SELECT messages, answer, finish_reason, mean_logprob FROM distill_pairs").fetchall()
            if len(rows) >= len(tasks) or time.monotonic() > deadline:
                return rows, seconds
            time.sleep(0.5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=60, help="held-out prompts per dimension")
    p.add_argument("--thresholds", default="0.5,0.7,0.8,0.9", help="min-confidence values P to tabulate")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--overhead", action="store_true",
                   help="also capture the same prompts with logprobs = false and print the time ratio")
    args = p.parse_args()

    from tokenops_plugins.multi_model._task_training import HELDOUT_SEED
    from tokenops_plugins.multi_model._suites import DIMENSIONS, make_suite

    thresholds = [float(x) for x in args.thresholds.split(",")]
    tasks = [t for d in DIMENSIONS for t in make_suite(d, args.n, HELDOUT_SEED)]
    by_prompt = {t.prompt: t for t in tasks}
    print(f"teacher: {model_version(LARGE)}", flush=True)
    rows, seconds = capture(Path(tempfile.mkdtemp(prefix="distill-filter-")), tasks, args.concurrency)
    print(f"captured {len(rows)} of {len(tasks)} answers through tokenops serve in {seconds:.0f}s\n", flush=True)

    graded: dict[str, list[dict]] = {d: [] for d in DIMENSIONS}
    for messages, answer, finish, mean in rows:
        task = by_prompt[json.loads(messages)[-1]["content"]]
        graded[task.dimension].append({"ok": bool(task.check(answer)), "truncated": finish == "length",
                                       "confidence": None if mean is None else math.exp(mean)})

    def acc(items: list[dict]) -> str:
        return f"{sum(i['ok'] for i in items) / len(items):.2f}" if items else "-"

    report: dict = {"teacher": model_version(LARGE), "n": args.n, "dimensions": {}}
    head = f"{'dimension':15s}{'n':>4s}{'acc':>6s}{'AUROC':>7s}{'conf R/W':>11s}{'trunc':>7s}{'acc ¬trunc':>11s}"
    head += "".join(f"   P={t:<4g} kept  acc kept/drop" for t in thresholds)
    print(head)
    totals = {"all": []}
    for dim, items in graded.items():
        totals["all"] += items
    for dim, items in [*graded.items(), ("all", totals["all"])]:
        with_conf = [i for i in items if i["confidence"] is not None]
        right = [i["confidence"] for i in with_conf if i["ok"]]
        wrong = [i["confidence"] for i in with_conf if not i["ok"]]
        area = auroc(right, wrong)
        kept_trunc = [i for i in items if not i["truncated"]]
        row = {"n": len(items), "accuracy": sum(i["ok"] for i in items) / max(1, len(items)), "auroc": area,
               "mean_conf_right": sum(right) / len(right) if right else None,
               "mean_conf_wrong": sum(wrong) / len(wrong) if wrong else None,
               "truncated": len(items) - len(kept_trunc), "thresholds": {}}
        conf = f"{row['mean_conf_right'] or 0:.2f}/{row['mean_conf_wrong'] or 0:.2f}" if right and wrong else "-"
        line = (f"{dim:15s}{len(items):4d}{acc(items):>6s}{'-' if area is None else f'{area:.2f}':>7s}{conf:>11s}"
                f"{row['truncated']:7d}{acc(kept_trunc):>11s}")
        for t in thresholds:
            kept = [i for i in kept_trunc if i["confidence"] is None or i["confidence"] >= t]
            dropped = [i for i in kept_trunc if not (i["confidence"] is None or i["confidence"] >= t)]
            share = len(kept) / max(1, len(items))
            row["thresholds"][t] = {"kept_share": share, "acc_kept": acc(kept), "acc_dropped": acc(dropped)}
            line += f"   {share:>10.2f}  {acc(kept):>4s}/{acc(dropped):<4s}"
        report["dimensions"][dim] = row
        print(line)
    print("\nacc: teacher accuracy on all captured answers; AUROC: confidence ranks right above wrong "
          "(0.5 none, 1 perfect);\nconf R/W: mean confidence of right/wrong answers; kept: share of all answers "
          "kept by both filters (not truncated, confidence >= P);\nacc kept/drop: accuracy of the kept and of the "
          "dropped (not truncated) answers.")
    if args.overhead:  # alternate the order so the machine's drift does not favour one side
        times = {True: [seconds], False: []}
        for logprobs in (False, False, True):
            _, s = capture(Path(tempfile.mkdtemp(prefix="distill-filter-")), tasks, args.concurrency, logprobs)
            times[logprobs].append(s)
        on, off = min(times[True]), min(times[False])
        report["overhead"] = {"with_logprobs_s": times[True], "without_logprobs_s": times[False]}
        print(f"\ncapture of {len(tasks)} requests, best of 2: with logprobs {on:.1f}s, without {off:.1f}s "
              f"(x{on / off:.2f}; shared machine: disturbed)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
