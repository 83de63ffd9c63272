"""``routing_eval.py --through-serve --adapters``: layer 1 over the default model and its three shipped
LoRA adapters (issue 40 §5), through a running ``tokenops serve``.

1. A ``tokenops serve`` on the default model (SmolLM2-135M-Instruct GGUF) with
   ``--lora smollm2-math|smollm2-instruction|smollm2-code=tokenops/demo_models/adapters/NAME`` and the
   profile router on ``auto`` (``threshold = 1.0``: the cheapest model with a perfect train-split
   score on the request's dimension, else the best-scoring one; all four cost the same).
2. A seeded mixed suite (the suites' seed 0: held out, never trained on) over ``--dimensions``; a
   seeded half is the train split. The base and each adapter answer every task (openai SDK, greedy).
3. Capability profiles of the four models from the train split's answers go to the server's
   ``profiles/models/`` (it reloads them); the test split is then sent to ``auto``.
4. The threshold router in a second server: ``strong`` = the adapter best on the train split,
   ``weak`` = the base, its win predictor learned on the train split; the test split to ``auto``.

Goal: routed quality on the test split >= the best single model's.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

from lora_quality import MAX_TOKENS, goals
from routing_eval_serve import Answer, server_costs, summarise

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = REPO / "tokenops" / "demo_models" / "adapters"
NAMES = ("smollm2-math", "smollm2-instruction", "smollm2-code")
BASE = "smollm2-135m-instruct"
DIMENSIONS = ("math", "instruction", "code", "extraction")  # the three adapters' suites and one where the base is strong


def ask_all(client, model: str, tasks, workers: int = 8) -> list[Answer]:
    """Greedy answers with the quality bench's token limits (the math adapter writes its two steps)."""
    import concurrent.futures as cf

    def ask(task) -> Answer:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": task.prompt}],
                                           temperature=0, max_tokens=MAX_TOKENS.get(task.dimension, 12))
        text = r.choices[0].message.content or ""
        return Answer(text, bool(task.check(text)), 0.0, None, r.model, r.id)

    with cf.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(ask, tasks))


def lora_args() -> list[str]:
    return [a for name in NAMES for a in ("--lora", f"{name}={ADAPTERS / name}")]


def profile_config() -> str:
    return '[plugins.router]\nuse = "profile"\n[plugins.router.profile]\nthreshold = 1.0\nmax_error_rate = 1.0\n'


def threshold_config(strong: str, threshold: float) -> str:
    return (f'[plugins.router]\nuse = "threshold"\n[plugins.router.threshold]\nstrong = "{strong}"\nweak = "{BASE}"\n'
            f'predictor = "profiles/routers/win_predictor.json"\nthreshold = {threshold}\n')


def run(per_dimension: int, seed: int, dimensions: tuple[str, ...] = DIMENSIONS, out=print) -> dict:
    import openai
    from tokenops_plugins.multi_model._profiles import save_profile, wilson
    from tokenops_plugins.multi_model._suites import make_mixed
    from tokenops_plugins.multi_model._text_model import Logistic
    from tokenops_plugins.multi_model.threshold_router import decide as threshold_decide

    from tokenops.testing_serve import ServeProcess

    sys.path.insert(0, str(REPO / "tests"))
    from real_model import SERVE_ENV

    models = (BASE, *NAMES)
    tasks = make_mixed(per_dimension, seed=seed, dimensions=dimensions)
    random.Random(seed).shuffle(tasks)
    train, test = tasks[:len(tasks) // 2], tasks[len(tasks) // 2:]
    workdir = Path(tempfile.mkdtemp(prefix="routing-eval-adapters-"))
    t0 = time.perf_counter()
    with ServeProcess(workdir, config=profile_config(), args=lora_args(), env=SERVE_ENV, ready_timeout_s=600) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=900)
        answers = {m: dict(zip((t.id for t in tasks), ask_all(client, m, tasks))) for m in models}
        out(f"asked {len(tasks)} tasks of {len(models)} models through serve in {time.perf_counter() - t0:.0f}s")
        profiles = {}
        for model in models:
            dims = {}
            for d in dimensions:
                sub = [t for t in train if t.dimension == d]
                k = sum(answers[model][t.id].correct for t in sub)
                lo, hi = wilson(k, len(sub))
                dims[d] = {"score": k / len(sub), "ci_low": lo, "ci_high": hi, "n": len(sub)}
            profiles[model] = {"model": model, "source": f"routing_eval --adapters train split seed={seed}",
                               "dimensions": dims}
            save_profile(profiles[model], workdir / "profiles" / "models")
        time.sleep(3.0)  # the server polls profiles/models every 2 s
        routed = ask_all(client, "auto", test)
        server_costs(srv, routed)

    def quality(model: str, ts) -> float:
        return sum(answers[model][t.id].correct for t in ts) / len(ts)

    rows = [(f"all {m}", quality(m, test), 1.0 if m == BASE else 0.0) for m in models]
    routed_q, _, _ = summarise(routed)
    served = {m: sum(a.model == m for a in routed) / len(routed) for m in models}
    rows.append(("profile router (auto)", routed_q, served[BASE]))
    # threshold router: strong = the adapter best on the train split, weak = the base
    strong = max(NAMES, key=lambda m: quality(m, train))
    labels = [float((not answers[BASE][t.id].correct) and answers[strong][t.id].correct) for t in train]
    predictor = Logistic().fit([t.prompt for t in train], labels)

    def pick(ts, thr):
        chosen = [answers[threshold_decide(predictor.predict(t.prompt), thr, strong, BASE).model][t.id] for t in ts]
        return sum(a.correct for a in chosen) / len(ts), 0.0, 0.0

    grid = [(i / 20, *pick(train, i / 20)) for i in range(21)]
    thr = max(grid, key=lambda p: (p[1], p[0]))[0]
    workdir2 = Path(tempfile.mkdtemp(prefix="routing-eval-adapters-threshold-"))
    (workdir2 / "profiles" / "routers").mkdir(parents=True)
    predictor.save(workdir2 / "profiles" / "routers" / "win_predictor.json")
    with ServeProcess(workdir2, config=threshold_config(strong, thr), args=lora_args(), env=SERVE_ENV,
                      ready_timeout_s=600) as srv2:
        client2 = openai.OpenAI(base_url=srv2.base_url, api_key="unused", max_retries=0, timeout=900)
        routed2 = ask_all(client2, "auto", test)
        server_costs(srv2, routed2)
    rows.append((f"threshold router (auto, strong {strong}, t={thr:.2f})", summarise(routed2)[0],
                 sum(a.model == BASE for a in routed2) / len(routed2)))
    per_dim = {m: {d: quality(m, [t for t in test if t.dimension == d]) for d in dimensions} for m in models}
    # every task is a held-out item: over all of them this is lora_quality.py's table (the quality goal)
    counts = {m: {d: (sum(answers[m][t.id].correct for t in tasks if t.dimension == d), per_dimension)
                  for d in dimensions} for m in models}
    return {"rows": rows, "counts": counts, "served": served, "per_dim": per_dim, "profiles": profiles, "train": len(train),
            "test": len(test), "seconds": time.perf_counter() - t0}


def report(result: dict, out=print) -> bool:
    counts = result["counts"]
    suites = list(next(iter(counts.values())))
    out(f"\nall {sum(n for _, n in next(iter(counts.values())).values())} held-out tasks (quality goal of issue 40):\n")
    out(f"| model | {' | '.join(suites)} |\n|---|{'---|' * len(suites)}")
    for m, row in counts.items():
        out(f"| {m} | {' | '.join(f'{k}/{n} = {k / n:.2f}' for k, n in row.values())} |")
    for line, _ in goals(counts, suites):
        out(line)
    out(f"\nthrough tokenops serve, base + 3 adapters; train {result['train']} / test {result['test']} tasks "
        f"({result['seconds']:.0f}s)\n")
    dims = list(next(iter(result["per_dim"].values())))
    out(f"| test split | {' | '.join(dims)} |\n|---|{'---|' * len(dims)}")
    for m, row in result["per_dim"].items():
        out(f"| {m} | {' | '.join(f'{row[d]:.2f}' for d in dims)} |")
    out("\n| strategy | quality | base share |\n|---|---|---|")
    for name, q, share in result["rows"]:
        out(f"| {name} | {q:.3f} | {share:.0%} |")
    out("\nprofile router's picks on the test split: " + ", ".join(f"{m} {s:.0%}" for m, s in result["served"].items()))
    singles = [r for r in result["rows"] if r[0].startswith("all ")]
    best = max(singles, key=lambda r: r[1])
    routed = [r for r in result["rows"] if "router" in r[0]]
    ok = any(r[1] >= best[1] for r in routed)
    out(f"\nbest single choice: {best[0]} {best[1]:.3f}; routed: " + ", ".join(f"{r[0]} {r[1]:.3f}" for r in routed)
        + f" -> goal (routed >= best single) {'MET' if ok else 'NOT MET'}")
    return ok
