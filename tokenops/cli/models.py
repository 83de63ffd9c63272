"""``tokenops models``: configured models, their backends and replicas."""

from __future__ import annotations

import json

import typer

from tokenops.cli.options import ConfigOpt, JsonOpt


def list_models(settings) -> list[dict]:
    """One entry per configured model (the demo model(s) when none are)."""
    from tokenops.backends.registry import model_configs, replica_urls

    out = []
    for m in model_configs(settings):
        urls = replica_urls(m)
        out.append({
            "name": m.name, "backend": m.backend, "path": m.path,
            "replicas": [{"name": f"{m.name}#{i}", "url": url} for i, url in enumerate(urls)],
            "served_model": m.served_model, "cost_input_per_1m": m.cost_input_per_1m,
            "cost_output_per_1m": m.cost_output_per_1m, "tags": list(m.tags), "engine": dict(m.engine),
            "is_default": not settings.models,
        })
    return out


def models_command(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """List the models `tokenops serve` would serve, with backends and replicas."""
    from rich.console import Console
    from rich.table import Table

    from tokenops.config import load_settings

    models = list_models(load_settings(config))
    if as_json:
        typer.echo(json.dumps({"models": models}, indent=2))
        return
    table = Table(title="tokenops models")
    for col in ("model", "backend", "replicas", "path / url", "$ in/out per 1M", "tags"):
        table.add_column(col)
    for m in models:
        where = m["path"] or ", ".join(r["url"] for r in m["replicas"] if r["url"]) or "(embedded demo model)"
        table.add_row(m["name"], m["backend"], str(len(m["replicas"])), where,
                      f"{m['cost_input_per_1m']:g} / {m['cost_output_per_1m']:g}", ", ".join(m["tags"]))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("models")(models_command)
