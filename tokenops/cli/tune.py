"""``tokenops tune --slo p95=200ms``: search tunables for the highest goodput under an SLO."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from tokenops.cli.options import AdminKeyOpt, JsonOpt, StoreOpt


def _parse_params(items: list[str]) -> dict[str, list[Any]]:
    from tokenops.cli import UserError

    out: dict[str, list[Any]] = {}
    for item in items:
        name, sep, vals = item.partition("=")
        if not sep or not vals.strip():
            raise UserError(f"--param {item!r}: use NAME=v1,v2 (e.g. engine.max_num_seqs=4,8,16)")
        out[name.strip()] = [v.strip() for v in vals.split(",") if v.strip()]
    return out


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


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)


def tune(
    slo: Annotated[
        list[str] | None, typer.Option("--slo", help="SLO like p95=200ms or tpot_p95=50ms (repeatable).")
    ] = None,
    slo_preset: Annotated[
        str | None, typer.Option("--slo-preset", help="Named SLOs from profiles/slo/NAME.toml (--slo adds/overrides).")
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="A running server: its live tunables are searched (default: the `tokenops serve` of this folder, else --launch).",
            envvar="TOKENOPS_URL",
        ),
    ] = None,
    launch: Annotated[
        bool,
        typer.Option(
            "--launch", help="Launch the engine, relaunched per configuration (restart tunables searched too)."
        ),
    ] = False,
    engine: Annotated[
        str,
        typer.Option(
            "--engine", help="With --launch: tokenops (bundled), vllm or sglang; any launcher a plugin registers."
        ),
    ] = "tokenops",
    model_path: Annotated[
        str | None,
        typer.Option(
            "--model-path",
            "--model",
            help="With --launch: model folder (default: the embedded demo model); vllm/sglang also take a hub id.",
        ),
    ] = None,
    launcher_cmd: Annotated[
        str | None,
        typer.Option(
            "--launcher-cmd", help="With --launch: the command that starts the engine, e.g. '/opt/vllm/bin/vllm serve'."
        ),
    ] = None,
    launcher_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--launcher-arg",
            help="With --launch: extra engine arguments, e.g. --launcher-arg='--tensor-parallel-size 2' (repeatable).",
        ),
    ] = None,
    ready_timeout: Annotated[
        float,
        typer.Option("--ready-timeout", help="With --launch: seconds a launched engine may take to become ready."),
    ] = 600.0,
    admin_key: AdminKeyOpt = None,
    workload: Annotated[
        str, typer.Option("--workload", "-w", help="Workload name (see tokenops bench).")
    ] = "synthetic",
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="file workload: JSON Lines of requests (see tokenops bench).")
    ] = None,
    input_len: Annotated[int, typer.Option("--input-len", help="Synthetic prompt tokens.")] = 128,
    output_len: Annotated[int, typer.Option("--output-len", help="Synthetic answer tokens.")] = 64,
    length_dist: Annotated[str, typer.Option("--length-dist", help="fixed | uniform | normal | lognormal.")] = "fixed",
    max_input_len: Annotated[int, typer.Option("--max-input-len", help="ShareGPT prompt cap (tokens).")] = 1024,
    max_output_len: Annotated[int, typer.Option("--max-output-len", help="ShareGPT answer cap (tokens).")] = 256,
    budget: Annotated[
        str,
        typer.Option(
            "--budget",
            help="Trials (20) or wall time (10m, 90s); the default keeps a study on the demo engine under 10 minutes.",
        ),
    ] = "6m",
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Search only these tunables or dotted prefixes (repeatable).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Leave these tunables or prefixes at their values.")
    ] = None,
    param: Annotated[
        list[str] | None, typer.Option("--param", help="Candidates for a tunable: NAME=v1,v2,... (repeatable).")
    ] = None,
    measure_s: Annotated[float, typer.Option("--measure-seconds", help="Length of one rate measurement.")] = 6.0,
    min_requests: Annotated[int, typer.Option("--min-requests", help="Fewest requests per measurement.")] = 12,
    max_measurements: Annotated[int, typer.Option("--max-measurements", help="Rate measurements per trial.")] = 5,
    start_rate: Annotated[
        float | None, typer.Option("--start-rate", help="First rate tried (default: probed).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the search, workload and arrivals.")] = 0,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Push the winner's live tunables to the running server (this folder's, or --url with --admin-key); restart ones are listed for the next start.",
        ),
    ] = False,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate",
            help="Afterwards re-measure default and winner back to back at the winner's goodput (extra time).",
        ),
    ] = False,
    profile_dir: Annotated[
        str, typer.Option("--profile-dir", help="Where the winner's profile is written.")
    ] = "profiles/engines",
    store: StoreOpt = None,
    no_store: Annotated[bool, typer.Option("--no-store", help="Do not save trials in the store.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Find the configuration with the highest goodput that meets every --slo."""
    from tokenops.bench.slo_presets import resolve

    slo = resolve(slo, slo_preset)
    say = _say(as_json)
    url, launch, local = _target(url, launch, apply, store, say)
    o = locals()
    plan = _plan(o, slo, local)
    report, session = _search(plan, as_json, say)
    out = report.outcome
    best = out.best
    from tokenops.tune.profile import write_profile

    profile = write_profile(report, profile_dir) if best is not None else None
    stored = None if no_store else _store_trials(report, None if launch else url, admin_key, store)
    restart_pending: list[str] = []
    if apply and best is not None:
        report.applied, restart_pending = _apply(best.params, url if not launch else None, admin_key, store)
    if as_json:
        _print_json(report, plan, session, profile, restart_pending, stored)
        return
    _print(report, profile, stored, url, restart_pending)


def _say(as_json: bool) -> Any:
    """Progress lines on stderr (none with --json)."""
    from rich.console import Console

    err = Console(stderr=True)
    return (lambda msg: None) if as_json else (lambda msg: err.print(msg, markup=False, highlight=False, style="dim"))


def _target(url: str | None, launch: bool, apply: bool, store: str | None, say: Any) -> tuple[str | None, bool, Any]:
    """(url, launch, the admin of this folder's server or None): ``--url``, this folder's
    ``tokenops serve``, or launching the bundled engine per configuration."""
    from tokenops.cli import UserError
    from tokenops.tune.local_server import LocalAdmin

    local = None if launch else LocalAdmin.find(store)
    if local is not None and url and _root(url) != _root(local.url):
        local.close()
        local = None  # --url names another server: the admin API with --admin-key
    if apply and launch and local is None and not url:
        raise UserError(
            "--apply needs a running server to apply to: start `tokenops serve` in this folder "
            "(or give --url and --admin-key)"
        )
    if not url and not launch:
        if local is not None:
            url = local.url
            say(f"tuning the server of this folder at {url} (its live tunables; restart ones need --launch)")
        else:
            launch = True
            say("no `tokenops serve` of this folder is running: launching the bundled engine per configuration")
    if launch:  # a launched engine starts from this folder's configuration: refuse what it would ignore
        from tokenops.config import load_settings
        from tokenops.plugin_sections import check_plugin_sections

        settings = load_settings()
        check_plugin_sections(settings.plugins, settings.source or "settings")
    return url, launch, local


def _plan(o: dict[str, Any], slo: list[str], local: Any) -> Any:
    """The :class:`TunePlan` of the parsed options ``o``."""
    from tokenops.cli import UserError
    from tokenops.slo import parse_slos
    from tokenops.tune.goodput import BracketConfig
    from tokenops.tune.launcher import split_args
    from tokenops.tune.runner import TunePlan
    from tokenops.tune.search import Budget
    from tokenops.tune.target import TuneError

    launch = o["launch"]
    try:
        return TunePlan(
            slos=parse_slos(slo),
            budget=Budget.parse(o["budget"]),
            url=o["url"],
            admin_key=o["admin_key"],
            launch=launch,
            engine=o["engine"],
            model_path=o["model_path"],
            launcher_cmd=o["launcher_cmd"],
            launcher_args=split_args(o["launcher_arg"] or []),
            ready_timeout_s=o["ready_timeout"],
            workload=o["workload"],
            workload_options={
                k: o[k]
                for k in ("input_len", "output_len", "length_dist", "max_input_len", "max_output_len", "dataset")
            },
            seed=o["seed"],
            only=o["only"] or [],
            exclude=o["exclude"] or [],
            overrides=_parse_params(o["param"] or []),
            measure_s=o["measure_s"],
            min_requests=o["min_requests"],
            start_rate=o["start_rate"],
            bracket=BracketConfig(max_measurements=o["max_measurements"]),
            validate=o["validate"],
            local_admin=None if launch else local,
        )
    except (TuneError, ValueError) as e:
        raise UserError(str(e)) from None


def _search(plan: Any, as_json: bool, say: Any) -> tuple[Any, Any]:
    """Run the study with its live view on a terminal; (report, session)."""
    from rich.console import Console

    from tokenops.bench.loadgen import BenchError
    from tokenops.bench.workloads import WorkloadError
    from tokenops.cli import UserError
    from tokenops.cli.tune_view import TuneView
    from tokenops.tune.runner import TuneSession
    from tokenops.tune.target import TuneError

    view = TuneView(plan.budget, Console(stderr=True), enabled=sys.stderr.isatty() and not as_json)
    session = TuneSession(
        plan,
        on_trial=lambda t, o: view.trial(t, o, session.space),
        on_status=lambda msg: view.status(msg) if view.enabled else say(msg),
    )
    try:
        with view:
            return session.run(), session
    except (TuneError, BenchError, WorkloadError) as e:
        raise UserError(str(e)) from None
    finally:
        session.close()


def _store_trials(report: Any, url: str | None, admin_key: str | None, store: str | None) -> str | None:
    """Save the trials in the store of the server they measured (its report lists them)."""
    from tokenops.store import default_path
    from tokenops.store.run_target import run_target
    from tokenops.tune.profile import save_trials

    return save_trials(report, store or default_path(), run_target(url, admin_key, store))


def _print_json(
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


def _print(report: Any, profile: Any, stored: str | None, url: str | None, restart_pending: list[str]) -> None:
    from rich.console import Console

    from tokenops.cli.tune_view import print_outcome

    console = Console()
    if not console.is_terminal:  # pipes and files get the whole table, not a guessed 80 columns
        console = Console(width=160)
    print_outcome(console, report, trials_table, _short)
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


def _root(url: str | None) -> str:
    return (url or "").rstrip("/").removesuffix("/v1").replace("localhost", "127.0.0.1")


def _apply(params: dict[str, Any], url: str | None, admin_key: str | None, store: str | None) -> tuple[dict, list[str]]:
    """Push the live part of ``params`` to the running server; returns (applied, restart-only names)."""
    from tokenops.cli import UserError
    from tokenops.plugin_manager import get_tunables
    from tokenops.tune.local_server import LocalAdmin
    from tokenops.tune.target import AdminClient, TuneError

    registry = get_tunables()
    live = {k: v for k, v in params.items() if k in registry and registry[k].live}
    restart = sorted(k for k in params if k not in live)
    local = LocalAdmin.find(store)
    if local is not None and url and _root(url) != _root(local.url):
        local.close()
        local = None
    admin: LocalAdmin | AdminClient
    if local is not None:
        admin = local
    elif url:
        admin = AdminClient(url, admin_key)
    else:
        raise UserError(
            "--apply: no `tokenops serve` of this folder is running (start it, or give --url and --admin-key)"
        )
    try:
        return admin.patch(live, actor="tune --apply"), restart
    except TuneError as e:
        raise UserError(f"could not apply the winner: {e}") from None
    finally:
        admin.close()
