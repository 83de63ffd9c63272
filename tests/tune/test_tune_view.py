"""What `tokenops tune` prints: a progress bar with ETA while it runs, the trials table once,
and verdicts that never divide by a default without sustained goodput."""

from __future__ import annotations

import io

from rich.console import Console

from tokenops.cli.tune_view import TuneView, verdict
from tokenops.tune.goodput import GoodputResult
from tokenops.tune.search import Budget, Trial, TuneOutcome


def _trial(number: int, goodput: float, status: str) -> Trial:
    return Trial(number, {"engine.max_num_seqs": 8 * (number + 1)}, GoodputResult(goodput, status), 0.0, 1.0)


def test_default_without_sustained_goodput_gets_no_ratio():
    out = TuneOutcome([_trial(0, 1.5, "unconfirmed"), _trial(1, 2.0, "complete")])
    assert out.ratio is None
    lines = verdict(out)
    assert "met the SLO once (at 1.5 req/s) and missed it on the repeat" in lines[0]
    assert "the default sustained none" in lines[1] and "inf" not in " ".join(lines)


def test_ratio_against_a_sustained_default_and_nothing_met():
    out = TuneOutcome([_trial(0, 2.0, "complete"), _trial(1, 3.0, "complete")])
    assert out.ratio == 1.5 and "1.50x the default's" in verdict(out)[1]
    none = TuneOutcome([_trial(0, 0.0, "infeasible"), _trial(1, 0.9, "unconfirmed")])
    assert none.best is None and "nothing met the SLO" in verdict(none)[1]


def test_progress_with_eta_on_a_terminal():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    view = TuneView(Budget(max_trials=4), console, enabled=True)

    class Space:
        def default(self):
            return {"engine.max_num_seqs": 8}

    out = TuneOutcome()
    with view:
        for i in range(2):
            out.trials.append(_trial(i, 1.0, "complete"))
            view.trial(out.trials[-1], out, Space())
            view.status("  rate 1/s x 5: met")
    text = buf.getvalue()
    assert "trial 2/4" in text and "ETA" in text


def test_no_terminal_prints_one_line_per_trial():
    buf = io.StringIO()
    view = TuneView(Budget(max_seconds=60), Console(file=buf, width=120), enabled=False)

    class Space:
        def default(self):
            return {"engine.max_num_seqs": 8}

    with view:
        t = _trial(0, 1.0, "complete")
        view.trial(t, TuneOutcome([t]), Space())
    assert buf.getvalue().count("trial 0:") == 1
