"""What ``tokenops tune`` shows: a progress bar with ETA over the budget and the trials
so far while it runs (on a terminal, cleared at the end), then the trials table once
and an honest verdict, or the whole study as JSON (``--json``).

The command in ``tune.py`` only parses options and runs the session; everything it prints is here.
"""

from __future__ import annotations

import json
import time
from typing import Any

import typer
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


def print_outcome(console: Console, report: Any) -> None:
    plan, out = report.plan, report.outcome
    console.print(
        trials_table(out, report.space, f"{report.study}: {report.model}, SLO {', '.join(s.label for s in plan.slos)}")
    )
    for line in verdict(out):
        console.print(line, markup=False, highlight=False)
    if out.best is not None and out.best is not out.default:
        console.print(f"winner: {_short(out.best.params, report.space.default())}", markup=False, highlight=False)
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


def _short(params: dict[str, Any], default: dict[str, Any]) -> str:
    diff = {k.removeprefix("engine."): v for k, v in params.items() if default.get(k) != v}
    return ", ".join(f"{k}={v}" for k, v in diff.items()) or "(default)"


def trials_table(outcome, space, title: str = "trials"):
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("#", "configuration (changes from default)", "goodput/s", "status", "meas.", "time"):
        t.add_column(col, justify="left" if col.startswith("config") or col == "status" else "right")
    best = outcome.best
    default = space.default()
    for tr in outcome.trials:
        mark = " [bold green]<- best[/]" if tr is best else ""
        good = (
            f"<{tr.result.points[0].rate:.3g}"
            if tr.result.status == "pruned" and tr.result.points
            else f"{tr.goodput:.3g}"
        )
        t.add_row(
            str(tr.number),
            _short(tr.params, default),
            good,
            tr.result.status + mark,
            str(len(tr.result.points)),
            f"{tr.duration_s:.0f}s",
        )
    return t


def print_json(
    report: Any, plan: Any, session: Any, profile: Any, restart_pending: list[str], stored: str | None
) -> None:
    out, best = report.outcome, report.outcome.best
    typer.echo(
        json.dumps(
            {
                "study": report.study,
                "model": report.model,
                "slo": [s.label for s in plan.slos],
                "elapsed_s": report.elapsed_s,
                "stopped_by": out.stopped_by,
                "space": {d.name: d.values for d in report.space.dims},
                "dropped": dict(session.irrelevant + report.space.dropped),
                "default": out.default.to_dict() if out.default else None,
                "best": best.to_dict() if best else None,
                "ratio": out.ratio,
                "profile": str(profile) if profile else None,
                "applied": report.applied,
                "restart_pending": restart_pending,
                "saved": stored,
                "validation": report.validation,
                "engine": plan.engine if plan.launch else None,
                "launch_flags": report.launch_flags,
                "trials": [t.to_dict() for t in out.trials],
            },
            indent=1,
            default=str,
        )
    )


def print_result(report: Any, profile: Any, stored: str | None, url: str | None, restart_pending: list[str]) -> None:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # pipes and files get the whole table, not a guessed 80 columns
        console = Console(width=160)
    print_outcome(console, report)
    if profile:
        console.print(
            f"profile written to {profile}; start with it: tokenops serve --engine-profile {profile.stem}",
            markup=False,
            highlight=False,
        )
    if stored:
        console.print(stored, markup=False, highlight=False)
    if report.applied:
        console.print(
            f"applied to {url or 'the server of this folder'}: {report.applied}", markup=False, highlight=False
        )
    if restart_pending:
        console.print(
            f"need a restart (take effect with `tokenops serve --engine-profile "
            f"{profile.stem if profile else 'NAME'}`): {', '.join(restart_pending)}",
            markup=False,
            highlight=False,
        )
