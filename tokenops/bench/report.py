"""Rich tables for bench results and comparisons."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from tokenops.bench.metrics import BenchSummary
from tokenops.bench.results import BenchRun


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    ms = v * 1000
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def levels_table(run: BenchRun) -> Table:
    """One row per load level (fits an 80-column terminal)."""
    t = Table(
        title=f"{run.id}  {run.model} @ {run.url}  workload={run.workload}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    cols = ["level", "err", "req/s", "tok/s", "TTFT50", "TTFT95", "TPOT95", "E2E95", "prefix"]
    has_slo = bool(run.slos)
    if has_slo:
        cols += ["good/s", "att", "SLO"]
    for col in cols:
        t.add_column(col, justify="left" if col == "level" else "right", no_wrap=True)
    for lv in run.levels:
        s = lv.summary
        row = [
            lv.label.removeprefix("rate ").removeprefix("concurrency "),
            str(s.num_errors),
            f"{s.request_rate:.2f}",
            f"{s.output_tps:.0f}",
            _ms(s.latency["ttft"]["p50"]),
            _ms(s.latency["ttft"]["p95"]),
            _ms(s.latency["tpot"]["p95"]),
            _ms(s.latency["e2e"]["p95"]),
            "-" if s.prefix_cache_hit_rate is None else f"{s.prefix_cache_hit_rate:.0%}",
        ]
        if has_slo:
            row += [
                f"{s.goodput_rps:.2f}" if s.goodput_rps is not None else "-",
                f"{s.attainment:.0%}" if s.attainment is not None else "-",
                "[green]met[/]" if s.is_slo_met else "[red]miss[/]",
            ]
        t.add_row(*row)
    kind = "concurrency" if run.levels and run.levels[0].summary.concurrency is not None else "offered rate"
    t.caption = (
        f"level = {kind}; tok/s = output tokens/s; latencies in ms (50 = p50); prefix = server prefix-cache hits per prompt token; good/s = req/s meeting every SLO, att = their share ({', '.join(run.slos)})"
        if has_slo
        else f"level = {kind}; tok/s = output tokens/s; latencies in ms (50 = p50); prefix = server prefix-cache hits per prompt token"
    )
    return t


def _figures(s: BenchSummary) -> dict[str, float | None]:
    out: dict[str, Any] = {"req/s": s.request_rate, "out tok/s": s.output_tps, "in tok/s": s.input_tps}
    for m in ("ttft", "tpot", "itl", "e2e"):
        for k in ("p50", "p95", "p99"):
            v = s.latency[m].get(k)
            out[f"{m} {k} (ms)"] = None if v is None else v * 1000
    out["goodput/s"] = s.goodput_rps
    out["errors"] = float(s.num_errors)
    return out


def compare_rows(a: BenchRun, b: BenchRun) -> list[dict[str, Any]]:
    """Per matching level (by position) and figure: a, b and the relative change."""
    rows = []
    for la, lb in zip(a.levels, b.levels):
        fa, fb = _figures(la.summary), _figures(lb.summary)
        for key in fa:
            va, vb = fa[key], fb[key]
            delta = None if va in (None, 0) or vb is None else (vb - va) / va
            rows.append(
                {
                    "level": la.label if la.label == lb.label else f"{la.label} | {lb.label}",
                    "figure": key,
                    "a": va,
                    "b": vb,
                    "change": delta,
                }
            )
    return rows


def compare_table(a: BenchRun, b: BenchRun) -> Table:
    t = Table(title=f"A = {a.id} ({a.model})   B = {b.id} ({b.model})", title_justify="left")
    for col in ("level", "figure", "A", "B", "B vs A"):
        t.add_column(col, justify="left" if col in ("level", "figure") else "right")
    for r in compare_rows(a, b):
        ch = r["change"]
        lower_better = "(ms)" in r["figure"] or r["figure"] == "errors"
        good = ch is not None and ((ch < 0) == lower_better) and abs(ch) > 0.005
        style = "green" if good else ("red" if ch is not None and abs(ch) > 0.005 else "")
        chs = "-" if ch is None else f"{ch:+.1%}"
        t.add_row(
            r["level"],
            r["figure"],
            "-" if r["a"] is None else f"{r['a']:.2f}",
            "-" if r["b"] is None else f"{r['b']:.2f}",
            f"[{style}]{chs}[/]" if style else chs,
        )
    if len(a.levels) != len(b.levels):
        t.caption = f"A has {len(a.levels)} level(s), B has {len(b.levels)}: compared the first {min(len(a.levels), len(b.levels))}"
    return t
