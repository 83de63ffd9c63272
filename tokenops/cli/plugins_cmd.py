"""``tokenops plugins``: every plugin by layer with version, hooks, tunables and launchers."""

from __future__ import annotations

import dataclasses
import json

import typer

from tokenops.cli.options import JsonOpt


def plugins_command(as_json: JsonOpt = False) -> None:
    """List plugins grouped by the four layers."""
    from rich.console import Console
    from rich.table import Table

    from tokenops.hookspecs import LAYERS
    from tokenops.plugin_manager import get_tunables, list_plugins

    infos = list_plugins()
    if as_json:
        registry = get_tunables()
        grouped: dict[str, list] = {layer: [] for layer in LAYERS}
        for info in infos:
            d = dataclasses.asdict(info)
            d["tunables"] = [registry[t].to_dict() for t in info.tunables]
            grouped.setdefault(info.layer, []).append(d)
        typer.echo(json.dumps({"layers": grouped}, indent=2, default=str))
        return
    table = Table(title="tokenops plugins")
    for col in ("layer", "plugin", "version", "source", "hooks", "tunables"):
        table.add_column(col)
    for info in infos:
        table.add_row(
            info.layer, info.name, info.version or "-", info.source, "\n".join(info.hooks), "\n".join(info.tunables)
        )
    console = Console()
    console.print(table)
    launchers = sorted(f"{n} ({info.name})" for info in infos for n in info.launchers)
    if launchers:
        console.print(
            f"tune launchers (tokenops tune --launch --engine NAME): {', '.join(launchers)}",
            markup=False,
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("plugins")(plugins_command)
