"""``tokenops dashboard``: the live Textual dashboard of a running server."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tokenops.cli.options import AdminKeyOpt, ConfigOpt

DashboardUrlOpt = Annotated[
    Optional[str],
    typer.Option("--url", help="Base URL of a running tokenops server; defaults to host:port of the gateway section of the config.", envvar="TOKENOPS_URL"),
]


def resolve_connection(url: str | None, admin_key: str | None, config: str | None) -> tuple[str, str | None]:
    """URL and admin key: flags/environment first, then ``[gateway]`` of the config."""
    from tokenops.config import load_settings

    gateway = load_settings(config).gateway
    if url is None:
        host = "127.0.0.1" if gateway.host in ("0.0.0.0", "::", "") else gateway.host
        url = f"http://{host}:{gateway.port}"
    if not url.startswith(("http://", "https://")):
        from tokenops.cli import UserError

        raise UserError(f"--url must start with http:// or https://, got {url!r}")
    return url.rstrip("/"), admin_key or gateway.admin_key


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(
        url: DashboardUrlOpt = None,
        admin_key: AdminKeyOpt = None,
        config: ConfigOpt = None,
        interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 1.0,
    ) -> None:
        """Live dashboard of a running server: throughput, latency/SLO, engines, routing, experts, live tuning, history.

        Keys: 1-6 switch screens, p pauses refreshing, q quits. If the server is not
        reachable the dashboard says so and keeps retrying with backoff.
        """
        base_url, key = resolve_connection(url, admin_key, config)
        # Imported here so the core and other commands never import textual.
        from tokenops.tui.app import DashboardApp
        from tokenops.tui.client import AdminClient

        client = AdminClient(base_url, key)
        try:
            DashboardApp(client, poll_interval_s=interval, prewarm_screens=True).run()
        finally:
            client.close()
