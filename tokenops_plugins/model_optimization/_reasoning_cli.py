"""``tokenops reasoning learn``: the adaptive thinking-budget table from recorded traffic.

Registered by the ``reasoning_budget`` plugin through ``tokenops_register_commands``. Reads
the store whether or not a server holds it (``open_store``) and writes the table where the
plugin reads it; a running server picks the new file up on its next request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from tokenops.cli.options import ConfigOpt, JsonOpt, StoreOpt

reasoning_app = typer.Typer(
    help="Reasoning models: thinking budgets learned from recorded traffic.", no_args_is_help=True
)


@reasoning_app.command("learn")
def learn(
    model: Annotated[str, typer.Option("--model", help="The reasoning model (its served name).")],
    coverage: Annotated[
        float,
        typer.Option(
            "--coverage",
            help="Share of a group's requests the budget must "
            "leave whole (stopped right after the first pass, or not at all).",
        ),
    ] = 0.95,
    min_items: Annotated[
        int, typer.Option("--min-items", help="Groups with fewer learnable requests stay unlimited.")
    ] = 5,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Table to write (default: the plugin's adaptive_table, else profiles/reasoning/<model>.json)."
        ),
    ] = None,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Learn per (dimension, prompt length) thinking budgets from MODEL's recorded requests."""
    from tokenops.config import load_settings
    from tokenops.store import open_store

    from ._traffic_budget import learn_from_traffic, samples_from_store

    settings = load_settings(config)
    if not 0 < coverage <= 1:
        raise typer.BadParameter(f"must be in (0, 1], got {coverage}", param_hint="--coverage")
    if min_items < 1:
        raise typer.BadParameter(f"must be >= 1, got {min_items}", param_hint="--min-items")
    with open_store(store or settings.store.path, read_only=True) as s:
        samples = samples_from_store(s, model)
    if not samples:
        raise typer.BadParameter(
            f"no learnable requests of {model!r} in the store: send it chat requests with "
            "unlimited thinking first (reasoning model, record_features on)",
            param_hint="--model",
        )
    table = learn_from_traffic(samples, coverage, min_items)
    table.meta["model"] = model
    path = out or Path(
        settings.plugin_settings("reasoning_budget").get("adaptive_table") or f"profiles/reasoning/{model}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(table.to_json(), indent=2) + "\n")
    tmp.replace(path)  # the server never reads a half-written table
    data = {"out": str(path), "samples": len(samples), "budgets": table.to_json()["budgets"]}
    line = f"learned from {len(samples)} requests -> {path}\n" + "\n".join(
        f"{dim}\t{words} words\t{'unlimited' if b is None else b}"
        for dim, row in data["budgets"].items()
        for words, b in row.items()
    )
    typer.echo(json.dumps(data) if as_json else line)
