"""``tokenops tune --slo p95=200ms``: search tunables for the highest goodput under an SLO."""

from __future__ import annotations

import sys
from typing import Any

import typer

from tokenops.cli import bench_options as bo
from tokenops.cli import tune_options as to
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


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)


def tune(
    slo: bo.SloOpt = None,
    slo_preset: bo.SloPresetOpt = None,
    url: to.TuneUrlOpt = None,
    launch: to.LaunchOpt = False,
    engine: to.EngineOpt = "tokenops",
    model_path: to.ModelPathOpt = None,
    launcher_cmd: to.LauncherCmdOpt = None,
    launcher_arg: to.LauncherArgOpt = None,
    ready_timeout: to.ReadyTimeoutOpt = 600.0,
    admin_key: AdminKeyOpt = None,
    workload: to.WorkloadOpt = "synthetic",
    dataset: to.DatasetOpt = None,
    history_store: to.HistoryStoreOpt = None,
    input_len: to.InputLenOpt = 128,
    output_len: to.OutputLenOpt = 64,
    length_dist: bo.LengthDistOpt = "fixed",
    max_input_len: to.MaxInputLenOpt = 1024,
    max_output_len: to.MaxOutputLenOpt = 256,
    budget: to.BudgetOpt = "6m",
    only: to.OnlyOpt = None,
    exclude: to.ExcludeOpt = None,
    param: to.ParamOpt = None,
    measure_s: to.MeasureSecondsOpt = 6.0,
    min_requests: to.MinRequestsOpt = 12,
    max_measurements: to.MaxMeasurementsOpt = 5,
    start_rate: to.StartRateOpt = None,
    seed: to.SeedOpt = 0,
    apply: to.ApplyOpt = False,
    validate: to.ValidateOpt = False,
    profile_dir: to.ProfileDirOpt = "profiles/engines",
    store: StoreOpt = None,
    no_store: to.NoStoreOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Find the configuration with the highest goodput that meets every --slo."""
    from tokenops.bench.slo_presets import resolve
    from tokenops.cli.tune_view import print_json, print_result
    from tokenops.tune.profile import write_profile

    slo = resolve(slo, slo_preset)
    say = _say(as_json)
    url, launch, local = _target(url, launch, apply, store, say)
    plan = _plan(locals(), slo, local)
    report, session = _search(plan, as_json, say)
    best = report.outcome.best
    profile = write_profile(report, profile_dir) if best is not None else None
    stored = None if no_store else _store_trials(report, None if launch else url, admin_key, store)
    restart_pending: list[str] = []
    if apply and best is not None:
        report.applied, restart_pending = _apply(best.params, url if not launch else None, admin_key, store)
    if as_json:
        print_json(report, plan, session, profile, restart_pending, stored)
        return
    print_result(report, profile, stored, url, restart_pending)


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
            workload_options=_workload_options(o),
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


def _workload_options(o: dict[str, Any]) -> dict[str, Any]:
    """The workload's options; the replay workload reads ``--history-store`` (several: as one), else
    ``--store``."""
    from tokenops.cli import UserError

    options = {
        k: o[k] for k in ("input_len", "output_len", "length_dist", "max_input_len", "max_output_len", "dataset")
    }
    if o.get("history_store") and o["workload"] != "replay":
        raise UserError("--history-store is read by --workload replay only")
    if o["workload"] == "replay":
        from tokenops.store import default_path

        options["store"] = o.get("history_store") or [o.get("store") or default_path()]
    return options


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
