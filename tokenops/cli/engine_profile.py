"""``tokenops engine-profile``: the tuned engine profiles ``tokenops tune`` writes to
``profiles/engines/`` (start a server with one: ``tokenops serve --engine-profile NAME``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tokenops.cli.options import JsonOpt

engine_profile_app = typer.Typer(
    help="Tuned engine profiles (profiles/engines/NAME.toml from `tokenops tune`).", no_args_is_help=True
)
DirOpt = Annotated[Path, typer.Option("--dir", help="Engine profile folder.")]


def _as_dict(profile) -> dict:
    return {"name": profile.name, "path": str(profile.path), "tunables": profile.tunables, "tune": profile.meta}


@engine_profile_app.command("list")
def list_command(directory: DirOpt = Path("profiles/engines"), as_json: JsonOpt = False) -> None:
    """The engine profiles in --dir: name, what they were tuned for, their values."""
    from tokenops.tune.engine_profile import load_profile

    profiles = [_as_dict(load_profile(p.name, directory)) for p in sorted(directory.glob("*.toml"))]
    if as_json:
        typer.echo(json.dumps(profiles))
        return
    if not profiles:
        typer.echo(f"no engine profiles in {directory}; make one with `tokenops tune --slo p95=200ms`")
    for p in profiles:
        tuned = ", ".join(f"{k} {v}" for k, v in p["tune"].items() if k in ("model", "hardware", "slo"))
        typer.echo(f"{p['name']}  ({tuned or 'no [tune] table'})")
        typer.echo("  " + ", ".join(f"{k}={v}" for k, v in p["tunables"].items()))


@engine_profile_app.command("show")
def show_command(
    name: Annotated[str, typer.Argument(help="Profile name (profiles/engines/NAME.toml) or a path.")],
    directory: DirOpt = Path("profiles/engines"),
    as_json: JsonOpt = False,
) -> None:
    """One engine profile's tunables and the [tune] table of where it was tuned."""
    from tokenops.tune.engine_profile import load_profile

    profile = _as_dict(load_profile(name, directory))
    if as_json:
        typer.echo(json.dumps(profile))
        return
    typer.echo(f"{profile['name']} ({profile['path']})")
    for key, value in {**profile["tunables"], **{f"tune.{k}": v for k, v in profile["tune"].items()}}.items():
        typer.echo(f"  {key} = {value}")
    typer.echo(f"start a server with it: tokenops serve --engine-profile {profile['name']}")


def register(app: typer.Typer) -> None:
    app.add_typer(engine_profile_app, name="engine-profile")
