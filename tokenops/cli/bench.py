"""``tokenops bench``: load-test an OpenAI-compatible server; ``tokenops bench compare A B``."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from tokenops.cli import bench_options as opts
from tokenops.cli.options import JsonOpt, StoreOpt

bench_app = typer.Typer(help="Benchmark an OpenAI-compatible server (TTFT/TPOT/ITL/E2E, throughput, goodput).")

_WORKLOAD_OPTS = (
    "input_len",
    "output_len",
    "length_dist",
    "length_spread",
    "prefix_len",
    "num_prefixes",
    "max_input_len",
    "max_output_len",
    "max_turns",
    "time_scale",
    "dataset",
    "store",
)


def _progress():
    """A rich progress bar on stderr, or None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    url: opts.BenchUrlOpt = None,
    model: opts.ModelOpt = None,
    workload: opts.WorkloadOpt = "synthetic",
    dataset: opts.DatasetOpt = None,
    num_requests: opts.NumRequestsOpt = 100,
    rate: opts.RateOpt = None,
    arrival: opts.ArrivalOpt = "poisson",
    burstiness: opts.BurstinessOpt = 1.0,
    concurrency: opts.ConcurrencyOpt = None,
    slo: opts.SloOpt = None,
    slo_preset: opts.SloPresetOpt = None,
    input_len: opts.InputLenOpt = 128,
    output_len: opts.OutputLenOpt = 64,
    length_dist: opts.LengthDistOpt = "fixed",
    length_spread: opts.LengthSpreadOpt = 0.25,
    prefix_len: opts.PrefixLenOpt = 256,
    num_prefixes: opts.NumPrefixesOpt = 4,
    max_input_len: opts.MaxInputLenOpt = 1024,
    max_output_len: opts.MaxOutputLenOpt = 256,
    max_turns: opts.MaxTurnsOpt = 4,
    time_scale: opts.TimeScaleOpt = 1.0,
    endpoint: opts.EndpointOpt = "chat",
    api_key: opts.ApiKeyOpt = None,
    temperature: opts.TemperatureOpt = "0",
    ignore_eos: opts.IgnoreEosOpt = False,
    seed: opts.SeedOpt = 0,
    timeout: opts.TimeoutOpt = 300.0,
    think_time: opts.ThinkTimeOpt = 0.0,
    ramp_up: opts.RampUpOpt = 0.0,
    reuse_prompts: opts.ReusePromptsOpt = False,
    plot: opts.PlotOpt = None,
    output: opts.OutputOpt = None,
    store: StoreOpt = None,
    no_store: opts.NoStoreOpt = False,
    admin_key_file: opts.AdminKeyFileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Load-test a server and print latency percentiles, throughput and goodput."""
    if ctx.invoked_subcommand is not None:
        return
    url = _server_url(url, store)
    values = locals()
    plan = _plan(values)
    run = _run(plan)
    where = None if no_store else _save(run, url, store, admin_key_file)
    _write(run, output, plot)
    _show(run, where, plot, as_json)


def _server_url(url: str | None, store: str | None) -> str:
    """``--url``, else the ``tokenops serve`` that holds this folder's store."""
    from tokenops.cli import UserError

    if url:
        return url
    from tokenops.store.remote import local_server_url

    found = local_server_url(store)
    if not found:
        raise UserError(
            "no server of this folder is running: start `tokenops serve` or give --url "
            "(the server's base URL, e.g. http://127.0.0.1:8000)"
        )
    return found


def _temperature(text: str) -> float | None:
    from tokenops.cli import UserError

    try:
        return None if text.strip().lower() == "server" else float(text)
    except ValueError:
        raise UserError(f"--temperature must be a number or 'server', got {text!r}") from None


def _plan(o: dict[str, Any]) -> Any:
    """The :class:`BenchPlan` of the parsed options ``o``; output problems stop the run before it starts."""
    from tokenops.bench import plot as plots
    from tokenops.bench.loadgen import BenchError
    from tokenops.bench.runner import BenchPlan, parse_levels
    from tokenops.bench.slo_presets import resolve
    from tokenops.bench.workloads import WorkloadError
    from tokenops.cli import UserError
    from tokenops.plugin_manager import get_workloads
    from tokenops.slo import parse_slos

    slo = resolve(o["slo"], o["slo_preset"])
    temp = _temperature(o["temperature"])
    try:
        if o["plot"]:
            plots.check_target(o["plot"])
        if o["output"]:
            plots.check_writable(o["output"], "--output")
    except ValueError as e:
        raise UserError(str(e)) from None
    wl_opts = {k: o[k] for k in _WORKLOAD_OPTS if k != "store"}
    if o["workload"] == "replay":
        from tokenops.store import default_path

        wl_opts["store"] = o["store"] or default_path()
    try:
        return BenchPlan(
            url=o["url"],
            workload=o["workload"],
            model=o["model"],
            num_requests=o["num_requests"],
            rates=parse_levels(o["rate"], "rate"),
            concurrencies=[int(c) for c in parse_levels(o["concurrency"], "concurrency")],
            arrival=o["arrival"],
            burstiness=o["burstiness"],
            seed=o["seed"],
            slos=parse_slos(slo or []),
            endpoint=o["endpoint"],
            api_key=o["api_key"],
            ignore_eos=o["ignore_eos"],
            timeout_s=o["timeout"],
            think_time_s=o["think_time"],
            ramp_up_s=o["ramp_up"],
            temperature=temp,
            reuse_prompts=o["reuse_prompts"],
            workload_options=wl_opts,
            registered_workloads=get_workloads(),
        )
    except (BenchError, WorkloadError, ValueError) as e:
        raise UserError(str(e)) from None


def _run(plan: Any) -> Any:
    """Every level of ``plan``, with a progress bar per level on a terminal."""
    from tokenops.bench.loadgen import BenchError
    from tokenops.bench.runner import run_plan_sync
    from tokenops.bench.workloads import WorkloadError
    from tokenops.cli import UserError

    progress = _progress()

    def on_level(label, num_expected):
        if progress is None:
            return None
        task = progress.add_task(label, total=num_expected, errors=0)
        counts = {"err": 0}

        def on_result(r):
            counts["err"] += 0 if r.is_ok else 1
            progress.update(task, advance=1, errors=counts["err"])

        return on_result

    try:
        if progress is not None:
            with progress:
                return run_plan_sync(plan, on_level)
        return run_plan_sync(plan, on_level)
    except (BenchError, WorkloadError, ValueError) as e:
        raise UserError(str(e)) from None


def _save(run: Any, url: str, store: str | None, admin_key_file: str | None) -> str | None:
    """Save the run in the store of the server it measured (its report lists it)."""
    import os

    from tokenops.bench.storage import save_run
    from tokenops.store import default_path
    from tokenops.store.run_target import run_target

    key = os.environ.get("TOKENOPS_ADMIN_KEY") or None
    if admin_key_file:
        from tokenops.gateway.admin.admin_key import read_key_file

        key = read_key_file(admin_key_file)
    return save_run(run, store or default_path(), run_target(url, key, store))


def _write(run: Any, output: str | None, plot: str | None) -> None:
    from tokenops.bench import plot as plots
    from tokenops.cli import UserError

    if output:
        run.save_json(output)
    if plot:
        try:
            plots.write_plot(run, plot)
        except ValueError as e:
            raise UserError(str(e)) from None


def _show(run: Any, where: str | None, plot: str | None, as_json: bool) -> None:
    from rich.console import Console

    from tokenops.bench import plot as plots
    from tokenops.bench.report import levels_table

    if as_json:
        from tokenops.bench.storage import _clean

        typer.echo(json.dumps(_clean({**run.to_dict(with_requests=False), "saved": where}), indent=1))
        return
    console = Console()
    console.print(levels_table(run))
    text = plots.text_plot(run)
    if text:
        console.print(text, markup=False, highlight=False)
    for lv in run.levels:
        if lv.summary.errors:
            console.print(f"[red]{lv.label}: errors {lv.summary.errors}[/]")
    if where:
        console.print(where, markup=False, highlight=False)
    if plot:
        console.print(f"plot written to {plot}", markup=False, highlight=False)


@bench_app.command("compare")
def compare(
    a: Annotated[str, typer.Argument(help="Run id or JSON file (from --json or --output).")],
    b: Annotated[str, typer.Argument(help="Run id or JSON file.")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare two runs level by level."""
    from rich.console import Console

    from tokenops.bench.report import compare_rows, compare_table
    from tokenops.bench.storage import load_run
    from tokenops.cli import UserError
    from tokenops.store import default_path

    try:
        ra, rb = load_run(a, store or default_path()), load_run(b, store or default_path())
    except (ValueError, KeyError) as e:
        raise UserError(f"cannot read bench run: {e}") from None
    if as_json:
        typer.echo(json.dumps({"a": ra.id, "b": rb.id, "rows": compare_rows(ra, rb)}, indent=1))
        return
    Console().print(compare_table(ra, rb))


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
