"""The search loop: trial 0 is the default configuration, later ones are
proposed by optuna's TPE sampler (seeded), each scored by its goodput.

TPE is a good fit here: evaluations are expensive and noisy, the space mixes
ordered integers with categoricals, and a few random start-up trials are
enough for it to concentrate on the promising region. Configurations already
measured are not measured again (TPE re-proposes points on small discrete
spaces); the cached score is told instead and costs no budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenops.tune.goodput import GoodputResult
from tokenops.tune.space import SearchSpace

#: evaluate(params, incumbent_goodput or None, deadline) -> GoodputResult
EvaluateFn = Callable[[dict[str, Any], float | None, float | None], GoodputResult]


@dataclass(slots=True)
class Trial:
    number: int
    params: dict[str, Any]
    result: GoodputResult
    started_s: float
    duration_s: float

    @property
    def goodput(self) -> float:
        return self.result.goodput

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.number, "params": self.params, "duration_s": self.duration_s, **self.result.to_dict()}


@dataclass(slots=True)
class TuneOutcome:
    trials: list[Trial] = field(default_factory=list)
    stopped_by: str = "budget"

    @property
    def default(self) -> Trial | None:
        return self.trials[0] if self.trials else None

    @property
    def best(self) -> Trial | None:
        done = [t for t in self.trials if t.result.status == "complete"]
        return max(done, key=lambda t: (t.goodput, -t.number)) if done else None

    @property
    def ratio(self) -> float | None:
        """Winner's goodput over the default's sustained goodput, both measured by the same
        procedure (confirmed by a repeat). None when either has none: a default that met the
        SLO once and missed it on the repeat has no goodput to divide by, and no ratio is made up."""
        if self.best is None or self.default is None or self.default.goodput <= 0:
            return None
        if self.default.result.status != "complete":
            return None
        return self.best.goodput / self.default.goodput


@dataclass(slots=True)
class Budget:
    """A number of trials, or a wall-clock limit in seconds (or both)."""

    max_trials: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.max_trials is None and self.max_seconds is None:
            raise ValueError("a budget needs trials or seconds")
        assert self.max_trials is None or self.max_trials >= 1
        assert self.max_seconds is None or self.max_seconds > 0

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``20`` trials, or ``10m`` / ``90s`` / ``1h``."""
        t = text.strip().lower()
        units = {"s": 1, "m": 60, "h": 3600}
        try:
            if t and t[-1] in units:
                return cls(max_seconds=float(t[:-1]) * units[t[-1]])
            return cls(max_trials=int(t))
        except (ValueError, AssertionError):
            raise ValueError(f"--budget {text!r}: give a number of trials (20) or a time (10m, 90s)") from None


class Tuner:
    """Runs trials until the budget is spent; ``on_trial`` sees each finished trial."""

    def __init__(
        self,
        space: SearchSpace,
        evaluate: EvaluateFn,
        budget: Budget,
        seed: int = 0,
        on_trial: Callable[[Trial, TuneOutcome], None] | None = None,
        num_startup_trials: int | None = None,
    ) -> None:
        self.space = space
        self.evaluate = evaluate
        self.budget = budget
        self.seed = seed
        self.on_trial = on_trial
        n = budget.max_trials or 12
        self.num_startup_trials = num_startup_trials if num_startup_trials is not None else max(2, min(5, n // 4))

    def _study(self) -> Any:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(
            seed=self.seed, n_startup_trials=self.num_startup_trials, multivariate=True
        )
        return optuna.create_study(direction="maximize", sampler=sampler)

    def _suggest(self, trial: Any) -> dict[str, Any]:
        params = {}
        for d in self.space.dims:
            if d.is_ordered:
                params[d.name] = d.values[trial.suggest_int(d.name, 0, len(d.values) - 1)]
            else:
                params[d.name] = d.values[trial.suggest_categorical(d.name, list(range(len(d.values))))]
        return params

    def _as_optuna(self, params: dict[str, Any]) -> dict[str, int]:
        return {d.name: d.index_of(params[d.name]) for d in self.space.dims}

    def run(self, started: float | None = None) -> TuneOutcome:
        """Run the study; ``started`` (``time.monotonic()``) counts earlier set-up against a time budget."""
        study = self._study()
        study.enqueue_trial(self._as_optuna(self.space.default()))
        out = TuneOutcome()
        seen: dict[tuple, GoodputResult] = {}
        t0 = time.monotonic() if started is None else started
        deadline = t0 + self.budget.max_seconds if self.budget.max_seconds else None
        max_proposals = (self.budget.max_trials or 1000) * 5 + 20
        for _ in range(max_proposals):
            if self.budget.max_trials is not None and len(out.trials) >= self.budget.max_trials:
                break
            if len(seen) >= max(1, self.space.size):
                out.stopped_by = "space exhausted"
                break
            if deadline is not None and out.trials:
                mean = sum(t.duration_s for t in out.trials) / len(out.trials)
                if time.monotonic() + 0.5 * mean > deadline:
                    break
            ot = study.ask()
            params = self._suggest(ot)
            key = self.space.key(params)
            if key in seen:
                study.tell(ot, seen[key].objective)
                continue
            best = out.best
            incumbent = best.goodput if best is not None and best.goodput > 0 else None
            start = time.monotonic()
            result = self.evaluate(params, incumbent, deadline)
            seen[key] = result
            study.tell(ot, result.objective)
            trial = Trial(len(out.trials), params, result, start - t0, time.monotonic() - start)
            out.trials.append(trial)
            if self.on_trial is not None:
                self.on_trial(trial, out)
        else:
            out.stopped_by = "proposals exhausted"
        if deadline is not None and time.monotonic() >= deadline - 1e-9:
            out.stopped_by = "time budget"
        return out
