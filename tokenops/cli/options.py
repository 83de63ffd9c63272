"""Shared ``Annotated`` option aliases for the CLI."""

from __future__ import annotations

from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
ConfigOpt = Annotated[
    str | None, typer.Option("--config", "-c", help="Path to tokenops.toml.", envvar="TOKENOPS_CONFIG")
]
StoreOpt = Annotated[str | None, typer.Option("--store", help="DuckDB store file.", envvar="TOKENOPS_STORE")]
UrlOpt = Annotated[str, typer.Option("--url", help="Base URL of a running tokenops server.", envvar="TOKENOPS_URL")]
AdminKeyOpt = Annotated[
    str | None, typer.Option("--admin-key", help="Admin key of the server.", envvar="TOKENOPS_ADMIN_KEY")
]
