"""What ``tokenops tune`` shows: a progress bar with ETA over the budget and the trials
so far while it runs (on a terminal, cleared at the end), then the trials table once
and an honest verdict."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text


class TuneView:
    """Progress over the budget: trials (``--budget 20``) or seconds (``--budget 6m``)."""

    def __init__(self, budget: Any, console: Console, enabled: bool) -> None:
        self.enabled = enabled
        self.budget = budget
        self.console = console
        self._t0 = time.monotonic()
        self._table: Any = Text("")
        self._status = Text("")
        self.progress = Progress(
            TextColumn("[bold]tune[/]"),
            BarColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        total = budget.max_trials if budget.max_trials is not None else budget.max_seconds
        self._task = self.progress.add_task("starting", total=total)
        self._live = Live(self._render(), console=console, refresh_per_second=2, transient=True) if enabled else None

    def _render(self) -> Group:
        return Group(self._table, self._status, self.progress)

    def _refresh(self, num_trials: int) -> None:
        if self._live is None:
            return
        if self.budget.max_trials is not None:
            self.progress.update(
                self._task, completed=num_trials, description=f"trial {num_trials}/{self.budget.max_trials}"
            )
        else:
            elapsed = time.monotonic() - self._t0
            self.progress.update(
                self._task,
                completed=min(elapsed, self.budget.max_seconds),
                description=f"{num_trials} trials, budget {self.budget.max_seconds:.0f}s",
            )
        self._live.update(self._render())

    def status(self, msg: str) -> None:
        self._status = Text(msg, style="dim")
        self._refresh(self._num_trials)

    _num_trials = 0

    def trial(self, trial: Any, outcome: Any, space: Any) -> None:
        from tokenops.cli.tune import _short, trials_table

        self._num_trials = len(outcome.trials)
        if self._live is not None:
            self._table = trials_table(outcome, space)
            self._refresh(self._num_trials)
        else:
            self.console.print(
                f"trial {trial.number}: {_short(trial.params, space.default())} -> "
                f"goodput {trial.goodput:.3g}/s ({trial.result.status}, {trial.duration_s:.0f}s)",
                markup=False,
                highlight=False,
            )

    def __enter__(self) -> TuneView:
        if self._live is not None:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)


_STATUS_WORDS = {
    "complete": "sustained {g:.3g} req/s (met the SLO there twice)",
    "unconfirmed": "no sustained goodput: met the SLO once (at {g:.3g} req/s) and missed it on the repeat",
    "infeasible": "met the SLO at no rate tried",
    "pruned": "could not beat the incumbent",
    "failed": "failed to apply",
}


def verdict(outcome: Any) -> list[str]:
    """The study's conclusion in words; never a ratio against a default without goodput."""
    best, default = outcome.best, outcome.default
    lines = []
    if default is not None:
        lines.append(
            "default: " + _STATUS_WORDS.get(default.result.status, default.result.status).format(g=default.goodput)
        )
    if best is None:
        lines.append(
            "nothing met the SLO with a confirmed (repeated) measurement; relax the SLO, shorten the "
            "workload or give the study more budget"
        )
        return lines
    if best is default:
        lines.append(
            f"winner (trial {best.number}): the default configuration, sustained {best.goodput:.3g} req/s "
            "(no other configuration sustained more)"
        )
        return lines
    ratio = outcome.ratio
    compare = f" = {ratio:.2f}x the default's" if ratio is not None else " (the default sustained none)"
    lines.append(f"winner (trial {best.number}): sustained {best.goodput:.3g} req/s{compare}")
    return lines


def print_outcome(console: Console, report: Any, trials_table: Callable, short: Callable) -> None:
    plan, out = report.plan, report.outcome
    console.print(
        trials_table(out, report.space, f"{report.study}: {report.model}, SLO {', '.join(s.label for s in plan.slos)}")
    )
    for line in verdict(out):
        console.print(line, markup=False, highlight=False)
    if out.best is not None and out.best is not out.default:
        console.print(f"winner: {short(out.best.params, report.space.default())}", markup=False, highlight=False)
        if report.launch_flags:
            console.print(f"as {plan.engine} flags: {' '.join(report.launch_flags)}", markup=False, highlight=False)
    for v in report.validation:
        vals = ", ".join(f"{k}={'-' if x is None else f'{x * 1000:.0f}ms'}" for k, x in v["slo"].items())
        console.print(
            f"validation at {v['rate']:.3g} req/s: {v['name']} {'met' if v['met'] else 'missed'} the SLO ({vals})",
            markup=False,
            highlight=False,
        )
    console.print(f"{len(out.trials)} trials in {report.elapsed_s:.0f}s (stopped: {out.stopped_by})", highlight=False)
