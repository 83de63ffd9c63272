"""``routing_eval.py --through-serve``: layer 1 measured on the task-trained ladder's real
answers through a running ``tokenops serve`` (see routing_eval.py for the simulated mode).

1. A ``tokenops serve`` with ``small`` = ``tokenops/demo_models/ladder-small`` and ``large`` =
   ``ladder-large`` (demo prices 0.10/0.40 and 0.60/2.40 USD per 1M tokens), the profile
   router on ``auto``, the cascade on ``cascade`` and the ensembles (``ensemble:*``).
2. Every task of a seeded mixed suite (seed 0: the ladder never trained on these prompts)
   is asked of both models through the server (openai SDK, temperature 0, with logprobs);
   each answer is checked by its task's checker. A seeded half is the train split.
3. The routers learn only from the train split's answers: capability profiles (written to
   the server's profiles/models/, which it reloads), the threshold router's win predictor,
   the cascade's confidence threshold (the cheapest on the train split within 2 points of
   all-large there, set live through the admin API).
4. On the test split: all-small and all-large (the answers from 2), the profile router
   (``auto``), the cascade and the ensembles are asked through the server; costs are the
   server's own per-request ``cost_usd`` (every tier and member added up). The threshold
   router runs in a second server (one server runs one ``use`` router) with the win
   predictor and threshold learned on the train split; ``tokenops route calibrate`` then
   reports the share it would send on that server's recorded traffic. The threshold/cascade
   curves over all thresholds are replayed on the test answers of step 2 (labelled).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LADDER = {"small": REPO / "tokenops" / "demo_models" / "ladder-small",
          "large": REPO / "tokenops" / "demo_models" / "ladder-large"}
PRICE = {"small": (0.10, 0.40), "large": (0.60, 2.40)}
MAX_TOKENS = {"code": 48, "extraction": 40, "instruction": 16}
QUALITY_SLACK = 0.02


def models_config() -> str:
    return "".join(
        f'[[models]]\nname = "{name}"\nbackend = "local"\npath = "{path}"\n'
        f"cost_input_per_1m = {PRICE[name][0]}\ncost_output_per_1m = {PRICE[name][1]}\n\n" for name, path in LADDER.items())


def threshold_config(threshold: float) -> str:
    return models_config() + f"""[plugins.router]
use = "threshold"
[plugins.router.threshold]
strong = "large"
weak = "small"
predictor = "profiles/routers/win_predictor.json"
threshold = {threshold}
"""


def serve_config(profile_threshold: float, samples: int) -> str:
    return models_config() + f"""[plugins.router]
use = "profile"
default = "large"
[plugins.router.profile]
threshold = {profile_threshold}
max_error_rate = 1.0

[plugins.cascade]
models = ["small", "large"]
threshold = 0.5

[plugins.validators]
use = ["logprob"]

[plugins.ensemble]
members = ["small", "large"]
samples = {samples}
temperature = 0.8
judge = "large"
aggregator = "large"
"""


@dataclass(slots=True)
class Answer:
    text: str
    correct: bool
    cost: float
    confidence: float | None = None
    model: str = ""
    request_id: str = ""
    extra: dict = field(default_factory=dict)


def ask(client, model: str, task, logprobs: bool = False) -> Answer:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": task.prompt}], temperature=0,
                                       max_tokens=MAX_TOKENS.get(task.dimension, 12), logprobs=logprobs or None)
    choice = r.choices[0]
    text = choice.message.content or ""
    confidence = None
    if logprobs and choice.logprobs and choice.logprobs.content:
        values = [t.logprob for t in choice.logprobs.content]
        confidence = math.exp(sum(values) / len(values))
    price = PRICE.get(model, (0.0, 0.0))
    cost = (r.usage.prompt_tokens * price[0] + r.usage.completion_tokens * price[1]) / 1e6
    return Answer(text, bool(task.check(text)), cost, confidence, r.model, r.id)


def ask_all(client, model: str, tasks, logprobs: bool = False, workers: int = 4) -> list[Answer]:
    with cf.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda t: ask(client, model, t, logprobs), tasks))


def server_costs(srv, answers: list[Answer]) -> None:
    """Replace each answer's cost by the server's recorded ``cost_usd`` (all tiers/members) and
    note the model it served and its decisions."""
    import httpx

    rows = httpx.get(f"{srv.url}/admin/requests", params={"limit": 1000}, headers=srv.admin_headers,
                     timeout=30).json()["requests"]
    by_suffix = {r["id"].split("-", 1)[-1]: r for r in rows}
    for a in answers:
        row = by_suffix.get(a.request_id.split("-", 1)[-1])
        assert row is not None, f"request {a.request_id} not in /admin/requests"
        a.cost, a.model, a.extra = float(row["cost_usd"] or 0.0), row["model_served"], row.get("decisions") or {}


def summarise(answers: list[Answer], strong_of=lambda a: a.model == "large") -> tuple[float, float, float]:
    return (sum(a.correct for a in answers) / len(answers), sum(a.cost for a in answers),
            sum(map(strong_of, answers)) / len(answers))


def cheapest_within(points: list[tuple[float, float, float, float]], q_target: float) -> tuple | None:
    """(threshold, quality, cost, share) with the lowest cost whose quality >= q_target."""
    ok = [p for p in points if p[1] >= q_target - 1e-12]
    return min(ok, key=lambda p: (p[2], -p[1])) if ok else None


def run(per_dimension: int, seed: int, ensemble_tasks: int, out=print) -> dict:
    import httpx
    import openai

    from tokenops.testing_serve import ServeProcess
    from tokenops_plugins.multi_model._profiles import save_profile, wilson
    from tokenops_plugins.multi_model._suites import DIMENSIONS, make_mixed
    from tokenops_plugins.multi_model._text_model import Logistic
    from tokenops_plugins.multi_model.threshold_router import decide as threshold_decide

    missing = [str(p) for p in LADDER.values() if not (p / "config.json").is_file()]
    if missing:
        raise SystemExit(f"ladder weights missing: {missing}; train them with scripts/train_ladder.py")
    tasks = make_mixed(per_dimension, seed=seed)
    random.Random(seed).shuffle(tasks)
    half = len(tasks) // 2
    train, test = tasks[:half], tasks[half:]
    profile_threshold = 0.5
    workdir = Path(tempfile.mkdtemp(prefix="routing-eval-"))
    t0 = time.perf_counter()
    with ServeProcess(workdir, config=serve_config(profile_threshold, 3)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
        answers = {m: dict(zip((t.id for t in tasks), ask_all(client, m, tasks, logprobs=True))) for m in LADDER}
        out(f"asked {len(tasks)} tasks of both models through serve in {time.perf_counter() - t0:.0f}s")

        # -- learn on the train split only
        def quality(ts, model):
            return sum(answers[model][t.id].correct for t in ts) / len(ts)

        profiles = {}
        for model in LADDER:
            dims = {}
            for d in DIMENSIONS:
                sub = [t for t in train if t.dimension == d]
                k = sum(answers[model][t.id].correct for t in sub)
                lo, hi = wilson(k, len(sub))
                dims[d] = {"score": k / len(sub), "ci_low": lo, "ci_high": hi, "n": len(sub)}
            profiles[model] = {"model": model, "source": f"routing_eval train split seed={seed}", "dimensions": dims}
            save_profile(profiles[model], workdir / "profiles" / "models")
        labels = [float((not answers["small"][t.id].correct) and answers["large"][t.id].correct) for t in train]
        predictor = Logistic().fit([t.prompt for t in train], labels)
        q_large_train = quality(train, "large")

        def cascade_pick(ts, thr):
            picked = []
            for t in ts:
                first = answers["small"][t.id]
                if (first.confidence or 0.0) >= thr:
                    picked.append((first, first.cost, 0))
                else:
                    second = answers["large"][t.id]
                    picked.append((second, first.cost + second.cost, 1))
            return (sum(a.correct for a, _, _ in picked) / len(ts), sum(c for _, c, _ in picked),
                    sum(s for _, _, s in picked) / len(ts))

        def threshold_pick(ts, thr):
            chosen = [answers[threshold_decide(predictor.predict(t.prompt), thr, "large", "small").model][t.id] for t in ts]
            return (sum(a.correct for a in chosen) / len(ts), sum(a.cost for a in chosen),
                    sum(a is answers["large"][t.id] for a, t in zip(chosen, ts)) / len(ts))

        grid = sorted({round(i / 100, 2) for i in range(0, 101)})
        cascade_train = [(thr, *cascade_pick(train, thr)) for thr in grid]
        threshold_train = [(thr, *threshold_pick(train, thr)) for thr in grid]
        cascade_thr = (cheapest_within(cascade_train, q_large_train - QUALITY_SLACK) or (1.0,))[0]
        router_thr = (cheapest_within(threshold_train, q_large_train - QUALITY_SLACK) or (0.0,))[0]
        out(f"learned on {len(train)} train tasks: cascade threshold {cascade_thr:.2f}, threshold-router threshold "
            f"{router_thr:.2f}; profiles written to the server's profiles/models/")

        # -- test split through the server
        r = httpx.patch(f"{srv.url}/admin/tunables", json={"values": {"cascade.threshold": cascade_thr}, "actor": "routing_eval"}, headers=srv.admin_headers,
                        timeout=30)
        assert r.status_code == 200, r.text
        time.sleep(3.0)  # the server polls profiles/models every 2 s
        rows = []
        q_small, c_small, _ = summarise([answers["small"][t.id] for t in test])
        q_large, c_large, _ = summarise([answers["large"][t.id] for t in test])
        rows.append(("all-small", q_small, c_small, 0.0, len(test)))
        rows.append(("all-large", q_large, c_large, 1.0, len(test)))
        # the ceiling, not a strategy: small unless only large answers right (knows the test answers)
        oracle = [answers["large"][t.id] if answers["large"][t.id].correct and not answers["small"][t.id].correct
                  else answers["small"][t.id] for t in test]
        rows.append(("oracle (knows the answers: the ceiling)", *summarise(oracle), len(test)))
        auto = ask_all(client, "auto", test)
        server_costs(srv, auto)
        rows.append((f"profile router (auto, score >= {profile_threshold})", *summarise(auto), len(test)))
        q, c, s = threshold_pick(test, router_thr)
        rows.append((f"threshold router (t={router_thr:.2f}, replayed)", q, c, s, len(test)))
        casc = ask_all(client, "cascade", test)
        server_costs(srv, casc)
        escalated = lambda a: bool(a.extra.get("escalated"))  # noqa: E731
        rows.append((f"cascade (logprob >= {cascade_thr:.2f})", *summarise(casc, escalated), len(test)))
        sub = test[:ensemble_tasks]
        sub_large = sum(answers["large"][t.id].cost for t in sub)
        ensembles = {}
        for method in ("vote", "best_of_n", "moa"):
            got = ask_all(client, f"ensemble:{method}", sub, workers=2)
            server_costs(srv, got)
            q, c, _ = summarise(got)
            ensembles[method] = got
            # scaled to the test split's size so the cost column compares (measured on the subset)
            rows.append((f"ensemble:{method} ({len(sub)} tasks)", q, c * c_large / max(sub_large, 1e-12), float("nan"),
                         len(sub)))
        subset = (  # the same subset answered by one model, for comparison
sum(answers["small"][t.id].correct for t in sub) / len(sub),
                  sum(answers["large"][t.id].correct for t in sub) / len(sub))
        grid_test = [(thr, *cascade_pick(test, thr)) for thr in grid[::5]]
        thr_test = [(thr, *threshold_pick(test, thr)) for thr in grid[::5]]
    # The threshold router through its own server (one `use` router per server): the win
    # predictor learned on the train split, the threshold chosen on it.
    workdir2 = Path(tempfile.mkdtemp(prefix="routing-eval-threshold-"))
    predictor.save((workdir2 / "profiles" / "routers").mkdir(parents=True, exist_ok=True)
                   or workdir2 / "profiles" / "routers" / "win_predictor.json")
    with ServeProcess(workdir2, config=threshold_config(router_thr)) as srv2:
        client2 = openai.OpenAI(base_url=srv2.base_url, api_key="unused", max_retries=0, timeout=300)
        routed = ask_all(client2, "auto", test)
        server_costs(srv2, routed)
        rows.insert(3, (f"threshold router (auto, t={router_thr:.2f})", *summarise(routed), len(test)))
        import subprocess
        import sys

        calibrate = subprocess.run([sys.executable, "-m", "tokenops", "route", "calibrate", "--strong-share", "0.3",
                                    "--store", str(srv2.store_path), "--out", str(workdir2 / "threshold.toml")],
                                   capture_output=True, text=True, cwd=workdir2, timeout=120)
        calibrate_line = (calibrate.stdout or calibrate.stderr).strip()
    return {"rows": rows, "q_small": q_small, "subset": subset, "calibrate": calibrate_line, "q_large": q_large, "c_large": c_large, "train": len(train),
            "test": len(test), "cascade_curve": grid_test, "threshold_curve": thr_test, "profiles": profiles,
            "cascade_thr": cascade_thr, "router_thr": router_thr, "seconds": time.perf_counter() - t0,
            "ensembles": ensembles, "accuracy_test": {m: {d: quality([t for t in test if t.dimension == d], m)
                                                         for d in DIMENSIONS} for m in LADDER}}


def report(result: dict, apgr, out=print) -> bool:
    """Print the table; returns whether the goal (a learned strategy within 2 points of
    all-large at >= 40% cost cut) was met."""
    q_large, c_large, q_small = result["q_large"], result["c_large"], result["q_small"]
    out(f"\nthrough tokenops serve on the ladder's real answers; train {result['train']} / test {result['test']} "
        f"tasks ({result['seconds']:.0f}s)\n")
    out("held-out test accuracy per dimension: " + "; ".join(
        f"{d} small {result['accuracy_test']['small'][d]:.2f} / large {result['accuracy_test']['large'][d]:.2f}"
        for d in result["accuracy_test"]["small"]))
    out(f"\n{'strategy':44s} {'quality':>8s} {'vs large':>9s} {'cost $':>10s} {'saved':>7s} {'large%':>7s}")
    for name, q, c, s, n in result["rows"]:
        share = "   -  " if math.isnan(s) else f"{s:7.1%}"
        out(f"{name:44s} {q:8.3f} {q - q_large:+9.3f} {c:10.6f} {1 - c / c_large:7.1%} {share}")
    for name, key in (("cascade (logprob), test split", "cascade_curve"), ("threshold router, test split", "threshold_curve")):
        points = result[key]
        out(f"\n{name}: threshold -> quality, saved, large share")
        for thr, q, c, s in points[::2]:
            out(f"  t={thr:.2f}  quality {q:.3f}  saved {1 - c / c_large:6.1%}  large {s:6.1%}")
        gap = q_large - q_small
        out(f"  APGR {apgr([(s, q) for _, q, _, s in points], q_small, q_large):.3f}" if gap > 0 else
            "  APGR undefined (large not better than small on the test split)")
    out(f"\nensembles ran on the first {len(next(iter(result['ensembles'].values())))} test tasks, where all-small "
        f"scores {result['subset'][0]:.3f} and all-large {result['subset'][1]:.3f}; their cost is scaled to the test "
        f"split's size")
    out(f"\n`tokenops route calibrate --strong-share 0.3` on the threshold server's recorded traffic:\n  "
        f"{result['calibrate']}")
    learned = [r for r in result["rows"] if r[0].startswith(("threshold", "cascade")) and "replayed" not in r[0]]
    ok = [r for r in learned if q_large - r[1] <= QUALITY_SLACK and 1 - r[2] / c_large >= 0.40]
    best = max(learned, key=lambda r: (q_large - r[1] <= QUALITY_SLACK, 1 - r[2] / c_large))
    out(f"\nbest learned strategy (threshold router or cascade): {best[0]} saves {1 - best[2] / c_large:.1%} "
        f"at {best[1] - q_large:+.3f} quality vs all-large -> goal (>= 40% saved, within 2 points) "
        f"{'MET' if ok else 'NOT MET'}")
    return bool(ok)
