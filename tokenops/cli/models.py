"""``tokenops models``: configured models, their backends and replicas."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tokenops.cli.options import AdminKeyOpt, ConfigOpt, JsonOpt

RunningUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url", help="A running tokenops server: add what its engines run (settings, weight encoding, KV dtype)."
    ),
]
#: The engine stats that say how a replica runs its model.
RUN_KEYS = ("weight_encoding", "kv_dtype", "speculative", "compiled")


def list_models(settings) -> list[dict]:
    """One entry per configured model (the demo model(s) when none are)."""
    from tokenops.backends.registry import model_configs, replica_urls

    out = []
    for m in model_configs(settings):
        urls = replica_urls(m)
        out.append(
            {
                "name": m.name,
                "backend": m.backend,
                "path": m.path,
                "replicas": [{"name": f"{m.name}#{i}", "url": url} for i, url in enumerate(urls)],
                "served_model": m.served_model,
                "cost_input_per_1m": m.cost_input_per_1m,
                "cost_output_per_1m": m.cost_output_per_1m,
                "tags": list(m.tags),
                "engine": dict(m.engine),
                "is_default": not settings.models,
            }
        )
    return out


def add_running(models: list[dict], url: str, admin_key: str | None) -> None:
    """Each model's ``running``: its replicas' engine settings and the tunables as they run
    (``/admin/stats`` and ``/admin/tunables`` of the server at ``url``)."""
    import httpx

    from tokenops.cli import UserError

    headers = {"X-Admin-Key": admin_key} if admin_key else {}
    try:
        stats = httpx.get(f"{url.rstrip('/')}/admin/stats", headers=headers, timeout=10).raise_for_status().json()
        tunables = httpx.get(f"{url.rstrip('/')}/admin/tunables", headers=headers, timeout=10).raise_for_status().json()
    except httpx.HTTPError as e:
        raise UserError(f"cannot read {url}: {e}") from None
    engines: dict[str, Any] = stats.get("engines") or {}
    for m in models:
        replicas = {
            name: {k: e.get(k) for k in RUN_KEYS}
            for name, e in engines.items()
            if e.get("model") == m["name"] or name.split("#")[0] == m["name"]
        }
        values = {t["name"]: (t.get("per_model") or {}).get(m["name"], t["value"]) for t in tunables["tunables"]}
        m["running"] = {"replicas": replicas, "tunables": values}


def models_command(
    config: ConfigOpt = None, as_json: JsonOpt = False, url: RunningUrlOpt = None, admin_key: AdminKeyOpt = None
) -> None:
    """List the models `tokenops serve` would serve, with backends and replicas (with --url: as they run)."""
    from rich.console import Console
    from rich.table import Table

    from tokenops.config import load_settings

    models = list_models(load_settings(config))
    if url:
        add_running(models, url, admin_key)
    if as_json:
        typer.echo(json.dumps({"models": models}, indent=2))
        return
    table = Table(title="tokenops models")
    for col in ("model", "backend", "replicas", "path / url", "$ in/out per 1M", "tags") + (
        ("running",) if url else ()
    ):
        table.add_column(col)
    for m in models:
        where = m["path"] or ", ".join(r["url"] for r in m["replicas"] if r["url"]) or "(embedded demo model)"
        row = [
            m["name"],
            m["backend"],
            str(len(m["replicas"])),
            where,
            f"{m['cost_input_per_1m']:g} / {m['cost_output_per_1m']:g}",
            ", ".join(m["tags"]),
        ]
        if url:
            first: dict[str, Any] = next(iter(m["running"]["replicas"].values()), {})
            row.append(", ".join(f"{k}={first[k]}" for k in RUN_KEYS if first.get(k) is not None) or "-")
        table.add_row(*row)
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("models")(models_command)
