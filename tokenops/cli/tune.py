"""``tokenops tune --slo p95=200ms``: search tunables for the highest goodput under an SLO."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, Optional

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
        good = f"<{tr.result.points[0].rate:.3g}" if tr.result.status == "pruned" and tr.result.points \
            else f"{tr.goodput:.3g}"
        t.add_row(str(tr.number), _short(tr.params, default), good,
                  tr.result.status + mark, str(len(tr.result.points)), f"{tr.duration_s:.0f}s")
    return t


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune(
        slo: Annotated[Optional[list[str]], typer.Option("--slo", help="SLO like p95=200ms or tpot_p95=50ms (repeatable).")] = None,
        slo_preset: Annotated[Optional[str], typer.Option("--slo-preset", help="Named SLOs from profiles/slo/NAME.toml (--slo adds/overrides).")] = None,
        url: Annotated[Optional[str], typer.Option("--url", help="A running server: its live tunables are searched.", envvar="TOKENOPS_URL")] = None,
        launch: Annotated[bool, typer.Option("--launch", help="Launch the engine, relaunched per configuration (restart tunables searched too).")] = False,
        engine: Annotated[str, typer.Option("--engine", help="With --launch: tokenops (bundled), vllm or sglang; any launcher a plugin registers.")] = "tokenops",
        model_path: Annotated[Optional[str], typer.Option("--model-path", "--model", help="With --launch: model folder (default: the embedded demo model); vllm/sglang also take a hub id.")] = None,
        launcher_cmd: Annotated[Optional[str], typer.Option("--launcher-cmd", help="With --launch: the command that starts the engine, e.g. '/opt/vllm/bin/vllm serve'.")] = None,
        launcher_arg: Annotated[Optional[list[str]], typer.Option("--launcher-arg", help="With --launch: extra engine arguments, e.g. --launcher-arg='--tensor-parallel-size 2' (repeatable).")] = None,
        ready_timeout: Annotated[float, typer.Option("--ready-timeout", help="With --launch: seconds a launched engine may take to become ready.")] = 600.0,
        admin_key: AdminKeyOpt = None,
        workload: Annotated[str, typer.Option("--workload", "-w", help="Workload name (see tokenops bench).")] = "synthetic",
        dataset: Annotated[Optional[str], typer.Option("--dataset", help="file workload: JSON Lines of requests (see tokenops bench).")] = None,
        input_len: Annotated[int, typer.Option("--input-len", help="Synthetic prompt tokens.")] = 128,
        output_len: Annotated[int, typer.Option("--output-len", help="Synthetic answer tokens.")] = 64,
        length_dist: Annotated[str, typer.Option("--length-dist", help="fixed | uniform | normal | lognormal.")] = "fixed",
        max_input_len: Annotated[int, typer.Option("--max-input-len", help="ShareGPT prompt cap (tokens).")] = 1024,
        max_output_len: Annotated[int, typer.Option("--max-output-len", help="ShareGPT answer cap (tokens).")] = 256,
        budget: Annotated[str, typer.Option("--budget", help="Trials (20) or wall time (10m, 90s).")] = "20",
        only: Annotated[Optional[list[str]], typer.Option("--only", help="Search only these tunables or dotted prefixes (repeatable).")] = None,
        exclude: Annotated[Optional[list[str]], typer.Option("--exclude", help="Leave these tunables or prefixes at their values.")] = None,
        param: Annotated[Optional[list[str]], typer.Option("--param", help="Candidates for a tunable: NAME=v1,v2,... (repeatable).")] = None,
        measure_s: Annotated[float, typer.Option("--measure-seconds", help="Length of one rate measurement.")] = 10.0,
        min_requests: Annotated[int, typer.Option("--min-requests", help="Fewest requests per measurement.")] = 20,
        max_measurements: Annotated[int, typer.Option("--max-measurements", help="Rate measurements per trial.")] = 6,
        start_rate: Annotated[Optional[float], typer.Option("--start-rate", help="First rate tried (default: probed).")] = None,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the search, workload and arrivals.")] = 0,
        apply: Annotated[bool, typer.Option("--apply", help="Push the winner to the running server (--url).")] = False,
        validate: Annotated[bool, typer.Option("--validate", help="Afterwards re-measure default and winner back to back at the winner's goodput (extra time).")] = False,
        profile_dir: Annotated[str, typer.Option("--profile-dir", help="Where the winner's profile is written.")] = "profiles/engines",
        store: StoreOpt = None,
        no_store: Annotated[bool, typer.Option("--no-store", help="Do not save trials in the store.")] = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Find the configuration with the highest goodput that meets every --slo."""
        from rich.console import Console
        from rich.live import Live

        from tokenops.bench.loadgen import BenchError
        from tokenops.bench.workloads import WorkloadError
        from tokenops.cli import UserError
        from tokenops.slo import parse_slos
        from tokenops.tune.goodput import BracketConfig
        from tokenops.tune.launcher import split_args
        from tokenops.tune.profile import save_trials, write_profile
        from tokenops.tune.runner import TunePlan, TuneSession, apply_winner
        from tokenops.tune.search import Budget
        from tokenops.tune.target import TuneError

        from tokenops.bench.slo_presets import resolve

        slo = resolve(slo, slo_preset)
        if apply and not url:
            raise UserError("--apply pushes the winner to a running server: use it with --url")
        try:
            plan = TunePlan(
                slos=parse_slos(slo), budget=Budget.parse(budget), url=url, admin_key=admin_key, launch=launch,
                engine=engine, model_path=model_path, launcher_cmd=launcher_cmd,
                launcher_args=split_args(launcher_arg or []), ready_timeout_s=ready_timeout, workload=workload,
                workload_options={"input_len": input_len, "output_len": output_len, "length_dist": length_dist,
                                  "max_input_len": max_input_len, "max_output_len": max_output_len,
                                  "dataset": dataset},
                seed=seed, only=only or [], exclude=exclude or [], overrides=_parse_params(param or []),
                measure_s=measure_s, min_requests=min_requests, start_rate=start_rate,
                bracket=BracketConfig(max_measurements=max_measurements), validate=validate)
        except (TuneError, ValueError) as e:
            raise UserError(str(e)) from None
        err = Console(stderr=True)
        is_tty = sys.stderr.isatty()
        live = Live(console=err, refresh_per_second=2, transient=False) if is_tty and not as_json else None
        session: TuneSession | None = None

        def on_trial(trial, outcome):
            if live is not None:
                live.update(trials_table(outcome, session.space))
            elif not as_json:
                err.print(f"trial {trial.number}: {_short(trial.params, session.space.default())} -> "
                          f"goodput {trial.goodput:.3g}/s ({trial.result.status}, {trial.duration_s:.0f}s)",
                          markup=False, highlight=False)

        def on_status(msg: str):
            if not as_json:
                (live.console if live is not None else err).print(msg, markup=False, highlight=False, style="dim")

        session = TuneSession(plan, on_trial=on_trial, on_status=on_status)
        try:
            if live is not None:
                with live:
                    report = session.run()
            else:
                report = session.run()
        except (TuneError, BenchError, WorkloadError) as e:
            raise UserError(str(e)) from None
        finally:
            session.close()
        out = report.outcome
        best, default = out.best, out.default
        profile = write_profile(report, profile_dir) if best is not None else None
        stored = None
        if not no_store:
            from tokenops.store import default_path

            stored = save_trials(report, store or default_path())
        if apply and best is not None:
            try:
                report.applied = apply_winner(url, admin_key, best.params)
            except TuneError as e:
                raise UserError(f"could not apply the winner: {e}") from None
        if as_json:
            typer.echo(json.dumps({
                "study": report.study, "model": report.model, "slo": [s.label for s in plan.slos],
                "elapsed_s": report.elapsed_s, "stopped_by": out.stopped_by,
                "space": {d.name: d.values for d in report.space.dims},
                "default": default.to_dict() if default else None, "best": best.to_dict() if best else None,
                "ratio": out.ratio, "profile": str(profile) if profile else None, "applied": report.applied,
                "validation": report.validation, "engine": plan.engine if plan.launch else None,
                "launch_flags": report.launch_flags,
                "trials": [t.to_dict() for t in out.trials]}, indent=1, default=str))
            return
        console = Console()
        console.print(trials_table(out, report.space, f"{report.study}: {report.model}, SLO {', '.join(s.label for s in plan.slos)}"))
        if best is None:
            console.print("[red]no configuration met the SLO at any rate tried; relax the SLO or shorten the workload[/]")
        else:
            ratio = out.ratio
            rtxt = "inf" if ratio == float("inf") else f"{ratio:.2f}x"
            console.print(f"default goodput {default.goodput:.3g} req/s; winner (trial {best.number}) "
                          f"{best.goodput:.3g} req/s = {rtxt} the default", highlight=False)
            console.print(f"winner: {_short(best.params, report.space.default())}", markup=False, highlight=False)
            if report.launch_flags:
                console.print(f"as {plan.engine} flags: {' '.join(report.launch_flags)}", markup=False, highlight=False)
        for v in report.validation:
            vals = ", ".join(f"{k}={'-' if x is None else f'{x * 1000:.0f}ms'}" for k, x in v["slo"].items())
            console.print(f"validation at {v['rate']:.3g} req/s: {v['name']} {'met' if v['met'] else 'missed'} the SLO "
                          f"({vals})", markup=False, highlight=False)
        console.print(f"{len(out.trials)} trials in {report.elapsed_s:.0f}s (stopped: {out.stopped_by})", highlight=False)
        if profile:
            console.print(f"profile written to {profile}", markup=False, highlight=False)
        if stored:
            console.print(stored, markup=False, highlight=False)
        if report.applied:
            console.print(f"applied to {url}: {report.applied}", markup=False, highlight=False)
