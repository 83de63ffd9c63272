"""``tokenops profile MODEL``: capability profiles on code-checked task suites."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from tokenops.cli.options import JsonOpt, StoreOpt

def profile_command(
    targets: Annotated[list[str], typer.Argument(help="MODEL to profile, or: compare A B.")],
    url: Annotated[str, typer.Option("--url", envvar="TOKENOPS_URL", help="OpenAI-compatible base URL (…/v1).")] = "http://127.0.0.1:8000/v1",
    suite: Annotated[Optional[list[str]], typer.Option("--suite", help="Dimension(s) to run (repeatable); default all.")] = None,
    n: Annotated[int, typer.Option("--n", help="Tasks per dimension.")] = 30,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    concurrency: Annotated[int, typer.Option("--concurrency")] = 4,
    cost_in: Annotated[float, typer.Option("--cost-in", help="USD per 1M input tokens.")] = 0.0,
    cost_out: Annotated[float, typer.Option("--cost-out", help="USD per 1M output tokens.")] = 0.0,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="OPENAI_API_KEY")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Profile folder.")] = Path("profiles/models"),
    store: StoreOpt = None,
    no_store: Annotated[bool, typer.Option("--no-store", help="Do not write the store.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Capability profile of MODEL on code-checked task suites (math, extraction,
    instruction, retrieval, code, classification), or `compare A B`."""
    from rich.progress import Progress

    from tokenops.cli import UserError

    if targets[0] == "compare":
        if len(targets) != 3:
            raise UserError("usage: tokenops profile compare MODEL_A MODEL_B")
        return compare(targets[1], targets[2], out_dir, as_json)
    if len(targets) != 1:
        raise UserError("usage: tokenops profile MODEL [--suite math ...]  or  tokenops profile compare A B")
    model = targets[0]
    from tokenops_plugins.multi_model._profiling import build_profile, run_suites, write_profile
    from tokenops_plugins.multi_model._suites import DIMENSIONS

    dims = suite or list(DIMENSIONS)
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown:
        raise UserError(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(DIMENSIONS)}")
    with Progress(transient=True, disable=as_json) as bar:
        task = bar.add_task(f"profiling {model}", total=n * len(dims))
        results = asyncio.run(run_suites(url, model, dims, n, seed, concurrency, api_key, lambda: bar.advance(task)))
    if all("error" in r for r in results):
        raise UserError(f"every request failed (first: {results[0]['error']}); is {url} serving {model!r}?")
    profile = build_profile(model, results, cost_in, cost_out, source=f"suites n={n} seed={seed} url={url}")
    store_path = None
    if not no_store:
        from tokenops.config import load_settings

        store_path = store or load_settings().store.path
    path = write_profile(profile, results, out_dir, store_path)
    if as_json:
        typer.echo(json.dumps(profile))
        return
    _print_profiles([profile])
    typer.echo(f"wrote {path}")


def compare(a: str, b: str, profiles_dir: Path, as_json: bool) -> None:
    """Per-dimension scores of two profiles side by side, with which is better where
    the confidence intervals do not overlap."""
    from tokenops.cli import UserError
    from tokenops_plugins.multi_model._profiles import load_profiles

    profiles = load_profiles(profiles_dir)
    missing = [m for m in (a, b) if m not in profiles]
    if missing:
        raise UserError(f"no profile for {', '.join(missing)} in {profiles_dir}; run `tokenops profile MODEL`")
    pa, pb = profiles[a], profiles[b]
    rows = []
    for dim in sorted(set(pa["dimensions"]) | set(pb["dimensions"])):
        da, db = pa["dimensions"].get(dim), pb["dimensions"].get(dim)
        verdict = "-"
        if da and db:
            if da["ci_low"] > db["ci_high"]:
                verdict = a
            elif db["ci_low"] > da["ci_high"]:
                verdict = b
            else:
                verdict = "no clear difference"
        rows.append({"dimension": dim, a: da and da["score"], b: db and db["score"], "better": verdict})
    if as_json:
        typer.echo(json.dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{a} vs {b}")
    for col in ("dimension", a, b, "better"):
        table.add_column(col)
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        table.add_row(r["dimension"], fmt(r[a]), fmt(r[b]), r["better"])
    Console().print(table)


def _print_profiles(profiles: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    for p in profiles:
        table = Table(title=f"capability profile: {p['model']}")
        for col in ("dimension", "score", "95% CI", "n"):
            table.add_column(col)
        for dim, v in p["dimensions"].items():
            table.add_row(dim, f"{v['score']:.2f}", f"{v['ci_low']:.2f}–{v['ci_high']:.2f}", str(v["n"]))
        Console().print(table)
        lat = p["latency"]
        typer.echo(f"latency p50 {lat['e2e_p50_s'] * 1000:.0f} ms, p95 {lat['e2e_p95_s'] * 1000:.0f} ms; cost per task ${p['cost']['usd_per_task']:.6f}")


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_command)
