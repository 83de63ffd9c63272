"""Layer-1 commands, registered through ``tokenops_register_commands``:

- ``tokenops profile run MODEL`` / ``profile compare A B`` / ``profile show [MODEL...]``:
  capability profiles on code-checked task suites (``profiles/models/``);
- ``tokenops route train`` / ``route calibrate``: the cost–quality threshold router.

With this plugin left out (``TOKENOPS_LOAD_PLUGINS``) the commands are absent.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    from typer._click import Context  # typer (0.29) vendors click: TyperGroup's methods take this Context

from tokenops import hookimpl
from tokenops.cli.options import JsonOpt, StoreOpt

TOKENOPS_LAYER = "multi_model"

ProfilesDirOpt = Annotated[Path, typer.Option("--dir", help="Capability profile folder.")]


class _ProfileGroup(TyperGroup):
    """``tokenops profile MODEL`` (the old spelling) gets one line naming the new one."""

    def resolve_command(self, ctx: Context, args: list[str]) -> Any:
        from tokenops.errors import UserError

        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            raise UserError(
                f"`tokenops profile {args[0]}`: profiling a model is now `tokenops profile run "
                f"{args[0]}` (subcommands: {', '.join(self.list_commands(ctx))})"
            )
        return super().resolve_command(ctx, args)


profile_app = typer.Typer(
    cls=_ProfileGroup,
    no_args_is_help=True,
    help="Capability profiles: per-dimension quality on code-checked task suites, latency, cost.",
)
route_app = typer.Typer(help="Layer-1 routing tools: the threshold router.", no_args_is_help=True)


@hookimpl
def tokenops_register_commands(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
    app.add_typer(route_app, name="route")


@profile_app.command("run")
def profile_run(
    model: Annotated[str, typer.Argument(help="The model to profile (its name at --url).")],
    url: Annotated[
        str, typer.Option("--url", envvar="TOKENOPS_URL", help="OpenAI-compatible base URL (…/v1).")
    ] = "http://127.0.0.1:8000/v1",
    suite: Annotated[
        list[str] | None, typer.Option("--suite", help="Dimension(s) to run (repeatable); default all.")
    ] = None,
    n: Annotated[int, typer.Option("--n", help="Tasks per dimension.")] = 30,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    concurrency: Annotated[int, typer.Option("--concurrency")] = 4,
    cost_in: Annotated[float, typer.Option("--cost-in", help="USD per 1M input tokens.")] = 0.0,
    cost_out: Annotated[float, typer.Option("--cost-out", help="USD per 1M output tokens.")] = 0.0,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Profile folder.")] = Path("profiles/models"),
    store: StoreOpt = None,
    no_store: Annotated[bool, typer.Option("--no-store", help="Do not write the store.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Profile MODEL on the task suites (math, extraction, instruction, retrieval, code,
    classification): writes profiles/models/MODEL.toml, its per-task results and the store."""
    from rich.progress import Progress
    from tokenops.errors import UserError

    from ._profiling import build_profile, run_suites, write_profile
    from ._suites import DIMENSIONS

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


@profile_app.command("compare")
def profile_compare(
    a: Annotated[str, typer.Argument(help="First model.")],
    b: Annotated[str, typer.Argument(help="Second model.")],
    profiles_dir: ProfilesDirOpt = Path("profiles/models"),
    as_json: JsonOpt = False,
) -> None:
    """Per-dimension scores of two profiles side by side, with which is better where
    the confidence intervals do not overlap."""
    pa, pb = _load(profiles_dir, [a, b])
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


@profile_app.command("show")
def profile_show(
    models: Annotated[list[str] | None, typer.Argument(help="Models to show; default every profile in --dir.")] = None,
    profiles_dir: ProfilesDirOpt = Path("profiles/models"),
    as_json: JsonOpt = False,
) -> None:
    """Print stored capability profiles."""
    from ._profiles import load_profiles

    profiles = _load(profiles_dir, models) if models else list(load_profiles(profiles_dir).values())
    if as_json:
        typer.echo(json.dumps(profiles))
        return
    if not profiles:
        typer.echo(f"no capability profiles in {profiles_dir}; make one with `tokenops profile run MODEL`")
    _print_profiles(profiles)


def _load(profiles_dir: Path, models: list[str]) -> list[dict]:
    from tokenops.errors import UserError

    from ._profiles import load_profiles

    profiles = load_profiles(profiles_dir)
    missing = [m for m in models if m not in profiles]
    if missing:
        raise UserError(f"no profile for {', '.join(missing)} in {profiles_dir}; run `tokenops profile run MODEL`")
    return [profiles[m] for m in models]


def _print_profiles(profiles: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    for p in profiles:
        table = Table(title=f"capability profile: {p['model']}")
        for col in ("dimension", "score", "95% CI", "n"):
            table.add_column(col)
        for dim, v in p.get("dimensions", {}).items():
            table.add_row(dim, f"{v['score']:.2f}", f"{v['ci_low']:.2f}–{v['ci_high']:.2f}", str(v["n"]))
        Console().print(table)
        lat, cost = p.get("latency", {}), p.get("cost", {})
        if "e2e_p50_s" in lat and "usd_per_task" in cost:
            typer.echo(
                f"latency p50 {lat['e2e_p50_s'] * 1000:.0f} ms, p95 {lat['e2e_p95_s'] * 1000:.0f} ms; "
                f"cost per task ${cost['usd_per_task']:.6f}"
            )


@route_app.command("calibrate")
def route_calibrate(
    strong_share: Annotated[
        float, typer.Option("--strong-share", help="Share of traffic to send to the strong model.")
    ],
    store: StoreOpt = None,
    out: Annotated[Path, typer.Option("--out", help="Where to write the threshold.")] = Path(
        "profiles/routers/threshold.toml"
    ),
    as_json: JsonOpt = False,
) -> None:
    """Set the threshold router's threshold from its scores on recorded traffic."""
    from tokenops.config import load_settings
    from tokenops.errors import UserError
    from tokenops.store import open_store

    from ._calibration import calibrate_share

    path = store or load_settings().store.path
    if not Path(path).is_file():
        raise UserError(f"store {path} does not exist; serve traffic through the threshold router first")
    with open_store(path, read_only=True) as db:  # through the server when one holds the file
        rows = db.execute("SELECT decisions FROM requests WHERE decisions IS NOT NULL").fetchall()
    scores = []
    for (text,) in rows:
        route = (json.loads(text) if isinstance(text, str) else text or {}).get("route") or {}
        if route.get("router") == "threshold" and route.get("score") is not None:
            scores.append(float(route["score"]))
    try:
        threshold, share = calibrate_share(scores, strong_share)
    except ValueError as e:
        raise UserError(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"threshold = {threshold!r}\nstrong_share = {share!r}\nrequested_share = {strong_share!r}\n"
        f"samples = {len(scores)}\n"
    )
    result = {
        "threshold": threshold,
        "strong_share": share,
        "requested_share": strong_share,
        "distinct_scores": len(set(scores)),
        "samples": len(scores),
        "file": str(out),
    }
    if as_json:
        typer.echo(json.dumps(result))
        return
    note = (
        ""
        if abs(share - strong_share) < 0.5 / len(scores) + 1e-9
        else (
            f" (asked for {strong_share:.0%}; the {len(set(scores))} distinct recorded score(s) allow no closer share)"
        )
    )
    typer.echo(
        f"threshold {threshold:.4f} sends {share:.0%} of {len(scores)} recorded requests to the strong "
        f"model{note}; wrote {out}"
    )


@route_app.command("train")
def route_train(
    weak: Annotated[str, typer.Option("--weak", help="The cheap model's name.")],
    strong: Annotated[str, typer.Option("--strong", help="The strong model's name.")],
    results_dir: Annotated[
        Path, typer.Option("--results", help="Folder with <model>.results.jsonl from `tokenops profile run`.")
    ] = Path("profiles/models"),
    out: Annotated[Path, typer.Option("--out")] = Path("profiles/routers/win_predictor.json"),
    as_json: JsonOpt = False,
) -> None:
    """Train the win predictor from two models' per-task profile results."""
    from tokenops.errors import UserError

    from ._text_model import Logistic

    def load(model: str) -> dict[str, dict]:
        path = results_dir / f"{model.replace('/', '_')}.results.jsonl"
        if not path.is_file():
            raise UserError(f"{path} not found; run `tokenops profile run {model}` first")
        return {r["task"]: r for r in map(json.loads, path.read_text().splitlines()) if r}

    w, s = load(weak), load(strong)
    common = sorted(set(w) & set(s))
    if len(common) < 20:
        raise UserError(f"only {len(common)} tasks profiled for both models; profile more (at least 20)")
    texts = [w[t]["prompt"] for t in common]
    targets = [float((not w[t]["correct"]) and s[t]["correct"]) for t in common]
    out.parent.mkdir(parents=True, exist_ok=True)
    Logistic().fit(texts, targets).save(out)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "weak": weak,
                    "strong": strong,
                    "num_tasks": len(common),
                    "num_need_strong": int(sum(targets)),
                    "out": str(out),
                }
            )
        )
        return
    typer.echo(f"trained on {len(common)} tasks ({int(sum(targets))} need the strong model); wrote {out}")
