"""Routing evaluation (layer 1): cost and quality of all-strong, all-cheap, each router
and the cascade on a labelled mixed workload, with a train/test split.

Two modes:

- ``--through-serve``: measured on the task-trained ladder's real answers through a
  running ``tokenops serve`` (``routing_eval_serve.py`` says how); the figures in
  docs/routing.md come from this mode.
- default: SIMULATED, a fast check of the routers' and cascade's mechanics on fakes,
  described below; its figures say nothing about real models.

In the simulated mode the two backends are deterministic fakes. Whether a model answers a task correctly is
fixed by a seeded hash against a per-dimension accuracy (the table below, an assumption
of this benchmark: a small model that is good at extraction, instruction following,
retrieval and classification but weak at arithmetic and code). Only the scorer sees
it: routers see the prompt text, and what they learn comes from the train split (the
profile router's capability profiles, the threshold router's win predictor). A wrong
answer is a real wrong answer that the task's own checker rejects. Answers carry a
token-logprob confidence that is higher on average when correct (overlapping ranges),
which is what the cascade's logprob validator sees.

Prices per 1M tokens (input/output) follow public list prices of a small and a large
hosted model: cheap 0.15/0.60, strong 2.50/10.00. Tokens are estimated as chars/4.

Prints a table, the cost–quality curve over thresholds for the threshold router and the
cascade, and APGR (average performance gap recovered, as RouteLLM reports it).

    python tests/benchmarks/routing_eval.py [--per-dimension 250] [--seed 0]          # simulated
    python tests/benchmarks/routing_eval.py --through-serve [--per-dimension 30]    # real, through serve
    python tests/benchmarks/routing_eval.py --through-serve --adapters [--per-dimension 12]  # base + LoRA adapters
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tokenops.config import ModelConfig, Settings  # noqa: E402
from tokenops.types import GatewayRequest  # noqa: E402
from tokenops_plugins.multi_model import _router_config as rc  # noqa: E402
from tokenops_plugins.multi_model import rules_router  # noqa: E402
from tokenops_plugins.multi_model._profiles import wilson  # noqa: E402
from tokenops_plugins.multi_model._suites import DIMENSIONS, Task, make_mixed  # noqa: E402
from tokenops_plugins.multi_model._text_model import Logistic  # noqa: E402
from tokenops_plugins.multi_model.profile_router import choose as profile_choose  # noqa: E402
from tokenops_plugins.multi_model.threshold_router import decide as threshold_decide  # noqa: E402
from tokenops_plugins.multi_model.validators import logprob_confidence  # noqa: E402

ACCURACY = {
    "cheap": {"math": 0.45, "extraction": 0.95, "instruction": 0.93, "retrieval": 0.94, "code": 0.40, "classification": 0.96},
    "strong": {"math": 0.95, "extraction": 0.96, "instruction": 0.95, "retrieval": 0.96, "code": 0.93, "classification": 0.97},
}
PRICE = {"cheap": (0.15, 0.60), "strong": (2.50, 10.00)}


@dataclass(slots=True)
class Answer:
    model: str
    text: str
    correct: bool
    confidence_logprobs: list[float]
    cost: float


def _u(*parts) -> float:
    h = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def fake_backend(model: str, task: Task, seed: int) -> Answer:
    """The fixed outcome of ``model`` on ``task``; the scorer checks it with the task's checker."""
    is_right = _u(seed, model, task.id, "correct") < ACCURACY[model][task.dimension]
    text = task.reference if is_right else "I am not sure, maybe 0"
    # Per-token confidence: correct answers are mostly confident, wrong ones mostly not.
    centre = 0.55 + 0.4 * _u(seed, model, task.id, "c") if is_right else 0.2 + 0.55 * _u(seed, model, task.id, "c")
    logprobs = [math.log(min(0.999, max(0.01, centre + 0.05 * (_u(seed, model, task.id, k) - 0.5)))) for k in range(8)]
    pin, pout = PRICE[model]
    cost = (len(task.prompt) / 4 * pin + max(8, len(text) / 4) * pout) / 1e6
    return Answer(model, text, task.check(text), logprobs, cost)


def evaluate(tasks: list[Task], pick, seed: int) -> tuple[float, float, float]:
    """(quality, cost, share of requests that reached the strong model) for a policy."""
    correct = cost = strong = 0.0
    for task in tasks:
        answer, used = pick(task)
        correct += answer.correct
        cost += sum(a.cost for a in used)
        strong += any(a.model == "strong" for a in used)
    return correct / len(tasks), cost, strong / len(tasks)


class Runner:
    """Calls the fake backends; outcomes are memoised (the code checker runs a subprocess)."""

    def __init__(self, seed: int):
        self.seed = seed
        self._memo: dict[tuple[str, str], Answer] = {}

    def call(self, model: str, task: Task) -> Answer:
        key = (model, task.id)
        if key not in self._memo:
            self._memo[key] = fake_backend(model, task, self.seed)
        return self._memo[key]

    def single(self, model: str):
        return lambda task: (lambda a: (a, [a]))(self.call(model, task))

    def routed(self, choose_model):
        def pick(task):
            a = self.call(choose_model(task), task)
            return a, [a]

        return pick

    def cascade(self, threshold: float):
        def pick(task):
            first = self.call("cheap", task)
            if (logprob_confidence(first.confidence_logprobs) or 0) >= threshold:
                return first, [first]
            second = self.call("strong", task)
            return second, [first, second]

        return pick


def build_profiles(train: list[Task], runner: Runner) -> dict:
    profiles = {}
    for model in ("cheap", "strong"):
        dims = {}
        for d in DIMENSIONS:
            sub = [t for t in train if t.dimension == d]
            k = sum(runner.call(model, t).correct for t in sub)
            lo, hi = wilson(k, len(sub))
            dims[d] = {"score": k / len(sub), "ci_low": lo, "ci_high": hi, "n": len(sub)}
        profiles[model] = {"model": model, "dimensions": dims}
    return profiles


def apgr(points: list[tuple[float, float]], q_weak: float, q_strong: float) -> float:
    """Area under PGR vs strong-call share, from (share, quality) points."""
    gap = q_strong - q_weak
    curve = sorted([(0.0, 0.0), (1.0, 1.0)] + [(s, (q - q_weak) / gap) for s, q in points])
    area = 0.0
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        area += (x1 - x0) * (y0 + y1) / 2
    return area


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-dimension", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--through-serve", action="store_true",
                    help="measure on the ladder's real answers through a running tokenops serve")
    ap.add_argument("--ensemble-tasks", type=int, default=24, help="test tasks asked of each ensemble (--through-serve)")
    ap.add_argument("--adapters", action="store_true",
                    help="with --through-serve: the default model and its three LoRA adapters instead of the ladder")
    args = ap.parse_args()
    if args.through_serve and args.adapters:
        import routing_eval_adapters

        per_dimension = args.per_dimension if args.per_dimension != 250 else 12
        routing_eval_adapters.report(routing_eval_adapters.run(per_dimension, args.seed))
        return
    if args.through_serve:
        import routing_eval_serve

        per_dimension = args.per_dimension if args.per_dimension != 250 else 30
        result = routing_eval_serve.run(per_dimension, args.seed, args.ensemble_tasks)
        routing_eval_serve.report(result, apgr)
        return
    print("SIMULATED: fake backends with an assumed accuracy table (see the docstring); "
          "use --through-serve for real answers\n")

    tasks = make_mixed(args.per_dimension, seed=args.seed)
    rng = random.Random(args.seed)
    rng.shuffle(tasks)
    half = len(tasks) // 2
    train, test = tasks[:half], tasks[half:]
    runner = Runner(args.seed)

    settings = Settings(models=[ModelConfig("cheap", cost_input_per_1m=PRICE["cheap"][0], cost_output_per_1m=PRICE["cheap"][1]),
                                ModelConfig("strong", cost_input_per_1m=PRICE["strong"][0], cost_output_per_1m=PRICE["strong"][1])])
    settings.plugins["router"] = {
        "use": "rules", "alias": "auto", "default": "cheap",
        "rules": {"rules": [{"regex": r"(?i)compute|python function", "model": "strong"}]},
    }
    config = rc.RouterConfig(settings)  # the prices the profile router orders candidates by
    router = rules_router.RulesRouter()  # an instance, as a gateway holds one
    router.tokenops_configure(settings)

    def as_request(task: Task) -> GatewayRequest:
        return GatewayRequest(kind="chat", model="auto", body={}, messages=[{"role": "user", "content": task.prompt}])

    profiles = build_profiles(train, runner)
    labels = [float((not runner.call("cheap", t).correct) and runner.call("strong", t).correct) for t in train]
    predictor = Logistic().fit([t.prompt for t in train], labels)

    rows = []
    q_strong, c_strong, _ = evaluate(test, runner.single("strong"), args.seed)
    q_cheap, c_cheap, _ = evaluate(test, runner.single("cheap"), args.seed)
    rows.append(("all-strong", q_strong, c_strong, 1.0))
    rows.append(("all-cheap", q_cheap, c_cheap, 0.0))
    q, c, s = evaluate(test, runner.routed(lambda t: router.tokenops_route(as_request(t), ["cheap", "strong"], {}).model), args.seed)
    rows.append(("rules router", q, c, s))
    for thr in (0.9, 0.93):
        q, c, s = evaluate(test, runner.routed(lambda t, thr=thr: profile_choose(t.prompt, ["cheap", "strong"], profiles, thr, config=config).model), args.seed)
        rows.append((f"profile router (score >= {thr})", q, c, s))

    curves = {"threshold router": [], "cascade (logprob)": []}
    for thr in [i / 20 for i in range(1, 20)]:
        q, c, s = evaluate(test, runner.routed(lambda t, thr=thr: threshold_decide(predictor.predict(t.prompt), thr, "strong", "cheap").model), args.seed)
        curves["threshold router"].append((thr, q, c, s))
        q, c, s = evaluate(test, runner.cascade(thr), args.seed)
        curves["cascade (logprob)"].append((thr, q, c, s))
    for name, points in curves.items():
        best = min((p for p in points if q_strong - p[1] <= 0.02), key=lambda p: p[2], default=None)
        if best:
            rows.append((f"{name} (t={best[0]:.2f})", best[1], best[2], best[3]))

    print(f"SIMULATED test split: {len(test)} tasks ({args.per_dimension} per dimension before the split), seed {args.seed}\n")
    print(f"{'strategy':34s} {'quality':>8s} {'loss':>7s} {'cost $':>10s} {'saved':>7s} {'strong%':>8s}")
    for name, q, c, s in rows:
        print(f"{name:34s} {q:8.3f} {q_strong - q:+7.3f} {c:10.5f} {1 - c / c_strong:7.1%} {s:8.1%}")
    for name, points in curves.items():
        print(f"\n{name}: threshold -> quality, cost saved vs all-strong, strong share")
        for thr, q, c, s in points[::3]:
            print(f"  t={thr:.2f}  quality {q:.3f}  saved {1 - c / c_strong:6.1%}  strong {s:6.1%}")
        print(f"  APGR {apgr([(s, q) for _, q, _, s in points], q_cheap, q_strong):.3f}")
    # The rules router's regex encodes what the benchmark's author knows about the fakes;
    # the verdict counts only strategies that learned from the train split.
    learned = [r for r in rows[2:] if not r[0].startswith("rules")]
    ok = [r for r in learned if q_strong - r[1] <= 0.02 and 1 - r[2] / c_strong >= 0.40]
    best = max(learned, key=lambda r: (q_strong - r[1] <= 0.02, 1 - r[2] / c_strong))
    print(f"\nbest learned strategy within 2 points of all-strong quality: {best[0]} saves {1 - best[2] / c_strong:.1%} "
          f"at {q_strong - best[1]:+.3f} quality -> goal (>= 40% saved, <= 2% loss) {'MET' if ok else 'NOT MET'}")


if __name__ == "__main__":
    main()
