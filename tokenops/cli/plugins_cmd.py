"""``tokenops plugins``: every plugin by layer with version, hooks, tunables and launchers."""

from __future__ import annotations

import dataclasses
import json

import typer

from tokenops.cli.options import JsonOpt


def plugins_command(as_json: JsonOpt = False) -> None:
    """List plugins grouped by the four layers, and the core's own tunables (the bundled engine's)."""
    from rich.console import Console
    from rich.table import Table

    from tokenops.hookspecs import LAYERS
    from tokenops.plugin_manager import ENGINE_TUNABLES_OWNER, get_tunables, list_plugins

    infos = list_plugins()
    registry = get_tunables()
    core = [t for t in registry if t.plugin == ENGINE_TUNABLES_OWNER]
    if as_json:
        grouped: dict[str, list] = {layer: [] for layer in LAYERS}
        for info in infos:
            d = dataclasses.asdict(info)
            d["tunables"] = [registry[t].to_dict() for t in info.tunables]
            grouped.setdefault(info.layer, []).append(d)
        core_json = {ENGINE_TUNABLES_OWNER: [t.to_dict() for t in core]}
        typer.echo(json.dumps({"layers": grouped, "core_tunables": core_json}, indent=2, default=str))
        return
    table = Table(title="tokenops plugins")
    for col in ("layer", "plugin", "version", "source", "hooks", "tunables"):
        table.add_column(col)
    for info in infos:
        table.add_row(
            info.layer, info.name, info.version or "-", info.source, "\n".join(info.hooks), "\n".join(info.tunables)
        )
    table.add_row("compute_model", f"{ENGINE_TUNABLES_OWNER} (core)", "-", "core", "", "\n".join(t.name for t in core))
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
