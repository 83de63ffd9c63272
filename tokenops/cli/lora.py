"""``tokenops lora load|unload|list``: LoRA adapters on a running server (its ``/admin/lora`` API).

The server is ``--url`` (or host:port of the config's ``[gateway]``); the admin key comes from
``--admin-key`` / ``TOKENOPS_ADMIN_KEY``. Adapters named in the config (``[[models]] lora``) or
with ``serve --lora`` are loaded at start; these commands change a running server (docs/lora.md).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tokenops.cli.options import AdminKeyOpt, ConfigOpt, JsonOpt

lora_app = typer.Typer(help="LoRA adapters served on a running server's bundled engine.", no_args_is_help=True)
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", help="Base URL of the running server (default: [gateway] host:port).", envvar="TOKENOPS_URL"),
]


def _call(
    url: str | None, admin_key: str | None, config: str | None, method: str, path: str, body: Any = None
) -> dict[str, Any]:
    from tokenops.cli import UserError
    from tokenops.cli.dashboard import resolve_connection
    from tokenops.tui.client import AdminClient, AdminError, ServerUnreachable

    base, key = resolve_connection(url, admin_key, config)
    client = AdminClient(base, key, timeout_s=120.0)
    try:
        return client._request(method, path, json=body)
    except ServerUnreachable:
        raise UserError(f"no tokenops server answers at {base}") from None
    except AdminError as e:
        raise UserError(e.message) from None
    finally:
        client.close()


def _print(data: dict[str, Any], as_json: bool, line: str) -> None:
    typer.echo(json.dumps(data, indent=2) if as_json else line)


@lora_app.command("list")
def list_command(
    url: UrlOpt = None, admin_key: AdminKeyOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False
) -> None:
    """The adapters served, each with its base model, rank, memory and folder."""
    data = _call(url, admin_key, config, "GET", "/admin/lora")
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    if not data["adapters"]:
        typer.echo("no LoRA adapters served")
    for a in data["adapters"]:
        size = f"{a['bytes'] / 2**20:.2f} MiB" if a.get("bytes") else "?"
        typer.echo(f"{a['name']}  base={a['parent']}  rank={a.get('rank')}  {size}  {a['path']}")


@lora_app.command("load")
def load_command(
    spec: Annotated[str, typer.Argument(help="NAME=FOLDER: a PEFT adapter folder served as model NAME.")],
    base: Annotated[
        str | None, typer.Option("--base", help="The base model (default: the first bundled-engine model).")
    ] = None,
    no_base_check: Annotated[
        bool,
        typer.Option(
            "--no-base-check", help="Do not compare the adapter's base_model_name_or_path with the served model's name."
        ),
    ] = False,
    url: UrlOpt = None,
    admin_key: AdminKeyOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Load an adapter onto a running server and serve it as a model."""
    from tokenops.cli import UserError

    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise UserError(f"{spec}: expected NAME=FOLDER")
    from pathlib import Path

    body: dict[str, Any] = {"name": name, "path": str(Path(path).expanduser().resolve())}
    if base is not None:
        body["base"] = base
    if no_base_check:
        body["check_base"] = False
    data = _call(url, admin_key, config, "POST", "/admin/lora", body)
    _print(data, as_json, f"loaded {data['name']} on {data['parent']} (rank {data.get('rank')})")


@lora_app.command("unload")
def unload_command(
    name: Annotated[str, typer.Argument(help="The adapter's model name.")],
    url: UrlOpt = None,
    admin_key: AdminKeyOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop serving an adapter (refused while requests run on it)."""
    data = _call(url, admin_key, config, "DELETE", f"/admin/lora/{name}")
    _print(data, as_json, f"unloaded {name}")


def register(app: typer.Typer) -> None:
    app.add_typer(lora_app, name="lora")
