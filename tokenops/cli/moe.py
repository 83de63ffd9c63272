"""``tokenops moe plan``: an EPLB placement from recorded expert load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tokenops.cli.options import JsonOpt, StoreOpt

moe_app = typer.Typer(help="MoE expert-load tools.", no_args_is_help=True)


def load_from_store(path: str, model: str | None) -> tuple[str, list[list[float]]]:
    """Sum recorded ``expert_load`` per layer and expert (read-only)."""
    from tokenops.cli import UserError
    from tokenops.store import open_store

    if not Path(path).is_file():
        raise UserError(f"store {path} does not exist; run `tokenops serve` with a MoE model first or pass --load FILE")
    with open_store(path, read_only=True) as store:  # through the server when one holds the file
        models = [r[0] for r in store.execute("SELECT DISTINCT model FROM expert_load ORDER BY 1").fetchall()]
        if not models:
            raise UserError("no expert load recorded yet; serve a MoE model and send traffic first")
        if model is None:
            if len(models) > 1:
                raise UserError(f"several MoE models recorded ({', '.join(models)}); choose one with --model")
            model = models[0]
        elif model not in models:
            raise UserError(f"no expert load recorded for {model!r}; recorded: {', '.join(models)}")
        rows = store.execute(
            "SELECT layer, expert, sum(tokens) FROM expert_load WHERE model = ? GROUP BY 1, 2 ORDER BY 1, 2", [model]
        ).fetchall()
    num_layers = max(r[0] for r in rows) + 1
    num_experts = max(r[1] for r in rows) + 1
    load = [[0.0] * num_experts for _ in range(num_layers)]
    for layer, expert, tokens in rows:
        load[layer][expert] = float(tokens)
    return model, load


@moe_app.command("plan")
def plan_command(
    devices: Annotated[int, typer.Option("--devices", help="Devices the experts are spread over.")],
    redundant: Annotated[int, typer.Option("--redundant", help="Extra expert replicas per layer.")] = 0,
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes (hierarchical placement when > 1).")] = 1,
    model: Annotated[str | None, typer.Option("--model", help="MoE model whose recorded load to use.")] = None,
    load_file: Annotated[
        Path | None, typer.Option("--load", help="JSON file with load[layer][expert] instead of the store.")
    ] = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compute expert replica counts and placement; print balancedness before and after."""
    from tokenops.cli import UserError
    from tokenops.config import load_settings
    from tokenops.plugin_manager import hook

    if load_file is not None:
        try:
            load = json.loads(load_file.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read load file {load_file}: {e}") from None
        model = model or load_file.stem
    else:
        model, load = load_from_store(store or load_settings().store.path, model)
    try:
        result = hook().tokenops_expert_placement(
            load=load, num_devices=devices, num_redundant=redundant, num_nodes=nodes
        )
    except ValueError as e:
        raise UserError(str(e)) from None
    if result is None:
        raise UserError("no plugin provides tokenops_expert_placement (is eplb disabled by TOKENOPS_LOAD_PLUGINS?)")
    if as_json:
        typer.echo(json.dumps({"model": model, **result.to_dict()}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"EPLB plan for {model}: {result.strategy}, {devices} devices, {redundant} redundant")
    for col in ("layer", "max/mean before", "max/mean after", "replicated experts"):
        table.add_column(col, justify="right")
    for i, layer in enumerate(result.layers):
        hot = {e: c for e, c in enumerate(layer.replicas) if c > 1}
        table.add_row(
            str(i),
            f"{result.balancedness_before[i]:.3f}",
            f"{layer.balancedness:.3f}",
            ", ".join(f"{e}x{c}" for e, c in sorted(hot.items())) or "-",
        )
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(moe_app, name="moe")
