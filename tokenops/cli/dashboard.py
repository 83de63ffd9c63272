"""``tokenops dashboard``: the live Textual dashboard of a running server.

It finds its server as ``report``, ``bench`` and ``tune`` do: the ``tokenops serve`` that
holds this folder's store (its store socket, readable by the same user only) gives the
URL, and the admin key file in that store folder (mode 0600, written by ``serve``) gives
the key. Another server is ``--url`` with ``--admin-key-file`` (or ``TOKENOPS_ADMIN_KEY``);
a key on the command line would be visible to every user in ``ps``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from tokenops.cli.options import ConfigOpt, StoreOpt

DashboardUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Base URL of a running tokenops server (default: the `tokenops serve` of this folder, "
        "else host:port of the config's [gateway]).",
        envvar="TOKENOPS_URL",
    ),
]
AdminKeyFileOpt = Annotated[
    str | None,
    typer.Option(
        "--admin-key-file",
        help="File whose first line is the admin key (default: this folder's server's "
        "key file, TOKENOPS_ADMIN_KEY, or [gateway] admin_key).",
    ),
]


def _same(url: str | None, other: str | None) -> bool:
    def root(u: str | None) -> str:
        return (u or "").rstrip("/").removesuffix("/v1").replace("localhost", "127.0.0.1")

    return bool(url) and root(url) == root(other)


def local_server(store: str | None) -> dict[str, Any] | None:
    """The ``hello`` of the server holding this folder's store, or None."""
    from tokenops.store.remote import connect_server

    remote = connect_server(store)
    if remote is None:
        return None
    try:
        return dict(remote.server_info)
    finally:
        remote.close()


def _own_key_file(info: dict[str, Any]) -> str | None:
    """The key in the local server's key file, when this user owns it (as the socket: same user only)."""
    from tokenops.gateway.admin.admin_key import key_file, read_key_file

    path = key_file(Path(str(info.get("path") or "")).expanduser().parent)
    try:
        if not path.is_file() or path.stat().st_uid != os.getuid():
            return None
    except OSError:
        return None
    return read_key_file(path)


def resolve_connection(
    url: str | None,
    admin_key: str | None,
    config: str | None,
    admin_key_file: str | None = None,
    store: str | None = None,
) -> tuple[str, str | None]:
    """URL and admin key. URL: the flag or ``TOKENOPS_URL``, else this folder's server, else
    ``[gateway]``. Key: ``--admin-key-file``, ``TOKENOPS_ADMIN_KEY`` / ``[gateway] admin_key``,
    else the key file of this folder's server when the URL is that server's."""
    from tokenops.cli import UserError
    from tokenops.config import load_settings

    gateway = load_settings(config).gateway
    info = local_server(store)
    if url is None and info is not None and info.get("url"):
        url = str(info["url"])
    if url is None:
        host = "127.0.0.1" if gateway.host in ("0.0.0.0", "::", "") else gateway.host
        url = f"http://{host}:{gateway.port}"
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--url must start with http:// or https://, got {url!r}")
    if admin_key_file:
        from tokenops.gateway.admin.admin_key import read_key_file

        return url.rstrip("/"), read_key_file(admin_key_file)
    key = admin_key or gateway.admin_key
    if key is None and info is not None and _same(url, info.get("url")):
        key = _own_key_file(info)
    return url.rstrip("/"), key


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(
        url: DashboardUrlOpt = None,
        admin_key_file: AdminKeyFileOpt = None,
        admin_key: Annotated[
            str | None,
            typer.Option("--admin-key", hidden=True, help="Deprecated (any user sees it in ps): use --admin-key-file."),
        ] = None,
        config: ConfigOpt = None,
        store: StoreOpt = None,
        interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 1.0,
        history_store: Annotated[
            list[str] | None,
            typer.Option(
                "--history-store",
                help="History screen: read these stores (repeat it: gateway replicas' files) as one "
                "instead of the server's own (docs/deploy.md).",
            ),
        ] = None,
    ) -> None:
        """Live dashboard of a running server: throughput, latency/SLO, engines, routing, experts, live tuning, history.

        With no flags it opens the `tokenops serve` of this folder (its store socket and
        key file). Keys: 1-6 switch screens, p pauses refreshing, q quits. If the server is
        not reachable the dashboard says so and keeps retrying with backoff.
        """
        if admin_key:
            typer.echo(
                "warning: --admin-key is visible to every user in ps; use --admin-key-file or TOKENOPS_ADMIN_KEY",
                err=True,
            )
        base_url, key = resolve_connection(url, admin_key, config, admin_key_file, store)
        # Imported here so the core and other commands never import textual.
        from tokenops.tui.app import DashboardApp
        from tokenops.tui.client import AdminClient

        client = AdminClient(base_url, key)
        history = None
        if history_store:
            from tokenops.tui.merged_history import MergedHistory

            history = MergedHistory(history_store)
        try:
            DashboardApp(client, poll_interval_s=interval, prewarm_screens=True, history=history).run()
        finally:
            client.close()
