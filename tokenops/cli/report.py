"""``tokenops report``: usage, cost, latency and cache hit rates from the store.

Opens the DuckDB file read-only. While a server holds the file DuckDB lets no
other process open it, so the command says so in one line and points at the
server's ``/admin/query`` endpoint.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from tokenops.cli.options import ConfigOpt, JsonOpt

SinceOpt = Annotated[
    str, typer.Option("--since", help="Start of the window: 7d, 24h, 30m, a date (2026-11-01), an ISO time, or all.")
]


StoresOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--store",
        help="DuckDB store file; repeat it to read several gateway replicas' stores as one (docs/deploy.md).",
        envvar="TOKENOPS_STORE",
    ),
]


def _store_path(store: list[str] | None, config: str | None) -> str | list[str]:
    if store:
        return store[0] if len(store) == 1 else store
    from tokenops.config import load_settings

    return load_settings(config).store.path


def collect_report(path: str | list[str], since: str, by: str | None = None) -> dict[str, Any]:
    """The report's data; ``requests`` is 0 when nothing was recorded in the window. Several
    paths (gateway replicas' stores) are read as one (:mod:`tokenops.store.merged_telemetry`).

    :raises StoreError: the file is in use by a server or has an old schema.
    """
    from tokenops.store import open_store, parse_since

    paths = [path] if isinstance(path, str) else list(path)
    start = parse_since(since)
    report: dict[str, Any] = {"store": paths[0], "since": start.isoformat(), "requests": 0, "requests_all_time": 0}
    if len(paths) > 1:
        from tokenops.store.merged_telemetry import merged_requests

        report["store"] = paths
        merged, report["stores"] = merged_requests(paths, start)
        with merged:  # the window's rows only: "all time" is the window here
            _fill(report, merged, start, by)
            report["requests_all_time"] = report["requests"]
        return report
    if not Path(paths[0]).exists():
        return report
    with open_store(paths[0], read_only=True) as store:  # through the server when one holds the file
        report["requests_all_time"] = store.execute("SELECT count(*) FROM requests").fetchone()[0]
        _fill(report, store, start, by)
    return report


def _fill(report: dict[str, Any], store: Any, start: Any, by: str | None) -> None:
    totals = store.execute(
        "SELECT count(*), coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0), coalesce(sum(cost_usd), 0.0) "
        "FROM requests WHERE ts >= ?",
        [start],
    ).fetchone()
    report["requests"], report["tokens_in"], report["tokens_out"], report["cost_usd"] = totals
    report["usage_by_model_day"] = store.run_query("usage_by_model_day", since=start)
    report["usage_by_class"] = _usage_by_class(store, start)
    report["cache_hit_rates"] = store.run_query("cache_hit_rates", since=start)
    report["route_reasons"] = store.run_query("route_reasons", since=start)
    report["bench_runs"] = store.run_query("bench_runs", since=start, limit=10)
    if by is not None:  # spend per API key or tenant (and model)
        report[f"spend_by_{by}"] = store.run_query(f"spend_by_{by}", since=start)


_BY_CLASS_COLUMNS = ("class", "requests", "batches", "errors", "tokens_in", "tokens_out", "cost_usd", "ttft_p95")


def _usage_by_class(store: Any, start: Any) -> dict[str, Any]:
    """Interactive traffic apart from Batch API lines (``priority_class``; a row written before
    the column existed is interactive). A batch line's ``cost_usd`` is already at ``[batches] discount``."""
    rows = store.execute(
        "SELECT coalesce(priority_class, 'interactive') AS class, count(*), count(DISTINCT batch_id), "
        "count(*) FILTER (WHERE status <> 'ok'), coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0), "
        "coalesce(sum(cost_usd), 0.0), quantile_cont(ttft_s, 0.95) FILTER (WHERE status = 'ok') "
        "FROM requests WHERE ts >= ? GROUP BY 1 ORDER BY 1 DESC",
        [start],
    ).fetchall()
    return {"columns": list(_BY_CLASS_COLUMNS), "rows": [list(r) for r in rows]}


class By(str, Enum):
    key = "key"
    tenant = "tenant"


ByOpt = Annotated[By | None, typer.Option("--by", help="Also show spend per API key or per tenant (and model).")]


def _print_spend(result: dict[str, Any], by: str) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console() if Console().is_terminal else Console(width=160)
    table = Table(title=f"Spend by {by} and model (USD)", box=box.SIMPLE_HEAD)
    for col in result["columns"]:
        table.add_column(col, justify="left" if col in ("tenant", "key_id", "model") else "right")
    for row in result["rows"]:
        table.add_row(*[f"{v:.6f}" if isinstance(v, float) else ("-" if v is None else str(v)) for v in row])
    console.print(table)


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _print_tables(report: dict[str, Any]) -> None:
    """The report's tables, one function each so a new table is a new function, not a longer one."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # pipes and files get whole tables, not a guessed 80 columns
        console = Console(width=160)
    console.print(
        f"[bold]{report['requests']}[/] requests since {report['since']} UTC: "
        f"{report['tokens_in']} tokens in, {report['tokens_out']} tokens out, ${report['cost_usd']:.4f}"
    )
    if "stores" in report:  # several gateway replicas read as one
        console.print("  " + ", ".join(f"{s['store']}: {s['requests']}" for s in report["stores"]))
    console.print(_usage_table(report["usage_by_model_day"]))
    by_class = report.get("usage_by_class") or {"rows": []}
    if any(row[0] == "batch" for row in by_class["rows"]):  # only when batches ran: no empty table otherwise
        console.print(_class_table(by_class))
    console.print(_cache_table(report["cache_hit_rates"]))
    console.print(_routes_table(report["route_reasons"]))
    runs = report.get("bench_runs") or {"rows": []}
    if runs["rows"]:
        console.print(_bench_runs_table(runs))


def _usage_table(usage: dict[str, Any]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title="Usage by model and day (latency of successful requests, ms)", box=box.SIMPLE_HEAD)
    for col in ("day", "model", "req", "err", "tok in", "tok out", "cost $", "ttft50", "ttft95", "e2e50", "e2e95"):
        table.add_column(col, justify="left" if col in ("day", "model") else "right", no_wrap=col != "model")
    ix = {c: i for i, c in enumerate(usage["columns"])}
    for row in usage["rows"]:
        table.add_row(
            row[ix["day"]],
            str(row[ix["model"]]),
            str(row[ix["requests"]]),
            str(row[ix["errors"]] + row[ix["rejected"]]),
            str(row[ix["tokens_in"]]),
            str(row[ix["tokens_out"]]),
            f"{row[ix['cost_usd']]:.4f}",
            _ms(row[ix["ttft_p50"]]),
            _ms(row[ix["ttft_p95"]]),
            _ms(row[ix["e2e_p50"]]),
            _ms(row[ix["e2e_p95"]]),
        )
    return table


def _class_table(by_class: dict[str, Any]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title="Interactive and batch traffic (batch cost at the [batches] discount)", box=box.SIMPLE_HEAD)
    for col in ("class", "req", "batches", "err", "tok in", "tok out", "cost $", "ttft95 ms"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for cls, num, batches, errors, tok_in, tok_out, cost, ttft95 in by_class["rows"]:
        table.add_row(
            cls, str(num), str(batches) if cls == "batch" else "-", str(errors), str(tok_in), str(tok_out),
            f"{cost:.4f}", _ms(ttft95),
        )  # fmt: skip
    return table


def _cache_table(cache: dict[str, Any]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title="Cache hit rates (gateway: per request; prefix: per prompt token)", box=box.SIMPLE_HEAD)
    for col in ("cache", "model", "lookups", "hits", "hit rate"):
        table.add_column(col, justify="left" if col in ("cache", "model") else "right")
    for cache_name, model, lookups, hits, rate in cache["rows"]:
        table.add_row(cache_name, str(model), str(lookups), str(hits), "-" if rate is None else f"{rate:.1%}")
    return table


def _routes_table(routes: dict[str, Any]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(
        title="Routing (requested -> served, router, reason; escalations; ensemble members)", box=box.SIMPLE_HEAD
    )
    for col in ("asked", "served", "router", "reason", "req", "share", "escalated", "ensemble"):
        table.add_column(col, justify="right" if col in ("req", "share", "escalated") else "left")
    ix = {c: i for i, c in enumerate(routes["columns"])}
    for row in routes["rows"]:
        table.add_row(
            str(row[ix["model_requested"]]),
            str(row[ix["model_served"]]),
            str(row[ix["router"]] or "-"),
            str(row[ix["route_reason"]] or "-"),
            str(row[ix["requests"]]),
            f"{row[ix['share']]:.1%}",
            str(row[ix["escalated"]]),
            str(row[ix["ensemble_members"]] or "-"),
        )
    return table


def _bench_runs_table(runs: dict[str, Any]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title="Bench runs (newest first; `tokenops bench compare ID ID`)", box=box.SIMPLE_HEAD)
    for col in ("run", "time", "target", "workload", "levels", "req", "err", "max req/s", "goodput/s", "ttft50"):
        table.add_column(col, justify="left" if col in ("run", "time", "target", "workload") else "right")
    ix = {c: i for i, c in enumerate(runs["columns"])}
    for row in runs["rows"]:

        def num(c: str, row: Any = row) -> str:  # row bound now: the loop moves on
            return "-" if row[ix[c]] is None else f"{row[ix[c]]:.3g}"

        table.add_row(
            str(row[ix["run_id"]]),
            str(row[ix["ts"]])[:19],
            str(row[ix["target"]]),
            str(row[ix["workload"]]),
            str(row[ix["levels"]]),
            str(row[ix["requests"]] or 0),
            str(row[ix["errors"]] or 0),
            num("max_throughput_rps"),
            num("max_goodput_rps"),
            _ms(row[ix["best_ttft_p50"]]),
        )
    return table


def report_command(
    since: SinceOpt = "7d",
    as_json: JsonOpt = False,
    store: StoresOpt = None,
    config: ConfigOpt = None,
    by: ByOpt = None,
) -> None:
    """Tokens, cost, requests and TTFT/E2E percentiles by model and day; cache hit rates;
    with --by key|tenant, spend per API key or tenant and model. Several --store: one report
    of all the gateway replicas' stores."""
    from tokenops.store import StoreError

    path = _store_path(store, config)
    try:
        report = collect_report(path, since, by.value if by is not None else None)
    except StoreError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if report["requests"] == 0:
        if report["requests_all_time"] == 0:
            where = path if isinstance(path, str) else ", ".join(path)
            report["message"] = f"no requests recorded yet in {where}"
        else:
            report["message"] = (
                f"no requests since {report['since']} UTC ({report['requests_all_time']} older); widen --since"
            )
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    elif "message" in report:
        typer.echo(report["message"])
    else:
        _print_tables(report)
        if by is not None:
            _print_spend(report[f"spend_by_{by.value}"], by.value)


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)
