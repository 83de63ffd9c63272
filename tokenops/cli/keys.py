"""``tokenops keys``: managed API keys and tenant budgets.

Talks to the running server's admin API (``--url``, or host:port of the config's
``[gateway]``; admin key from ``--admin-key`` / ``TOKENOPS_ADMIN_KEY``). When no
server answers there, it works on the store file itself (and on Redis when
``[plugins.keys] redis_url`` is configured), and a server started later loads
the keys from the store.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tokenops.cli.options import AdminKeyOpt, ConfigOpt, JsonOpt, StoreOpt

keys_app = typer.Typer(
    help="Managed API keys (secret shown once, stored hashed) and tenant spend budgets.", no_args_is_help=True
)

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Base URL of a running server (default: [gateway] host:port; the store when none answers).",
        envvar="TOKENOPS_URL",
    ),
]
ModelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model", "-m", help="A model or alias (e.g. auto) the key may use; repeatable (default: every model)."
    ),
]
RpmOpt = Annotated[float | None, typer.Option("--rpm", help="Requests per minute for this key.")]
TpmOpt = Annotated[float | None, typer.Option("--tpm", help="Tokens per minute for this key.")]
BudgetOpt = Annotated[float | None, typer.Option("--budget-usd", help="Spend budget in USD per period.")]
PeriodOpt = Annotated[str | None, typer.Option("--budget-period", help="daily, monthly or <N>h (default monthly).")]
SoftOpt = Annotated[float | None, typer.Option("--soft-budget-usd", help="Spend that only warns (header + metric).")]
ExpiresOpt = Annotated[str | None, typer.Option("--expires-at", help="ISO 8601 time (UTC unless an offset is given).")]
NameOpt = Annotated[str | None, typer.Option("--name", help="A label for the key.")]


class _Target:
    """The admin API of a server, or the store when no server runs."""

    def __init__(self, url: str | None, admin_key: str | None, config: str | None, store: str | None) -> None:
        from tokenops.cli.dashboard import resolve_connection
        from tokenops.tui.client import AdminClient, ServerUnreachable

        self.config, self.store_path = config, store
        self.client = None
        base, key = resolve_connection(url, admin_key, config)
        client = AdminClient(base, key, timeout_s=15.0)
        try:
            client._request("GET", "/health")
            self.client = client
        except ServerUnreachable:
            client.close()
            if url is not None:
                from tokenops.cli import UserError

                raise UserError(f"no tokenops server answers at {base}") from None

    def call(self, method: str, path: str, op: str, *args: Any, body: Any = None, params: Any = None) -> Any:
        from tokenops.cli import UserError

        if self.client is not None:
            from tokenops.tui.client import AdminError

            try:
                return self.client._request(method, path, json=body, params=params)
            except AdminError as e:
                raise UserError(e.message) from None
        return self._local(op, *args)

    def _local(self, op: str, *args: Any) -> Any:
        from tokenops.cli import UserError
        from tokenops.config import load_settings
        from tokenops.keys import admin_ops
        from tokenops.keys.models import is_routable_name
        from tokenops.keys.service import KeyService
        from tokenops.store import Store

        settings = load_settings(self.config)
        from tokenops.gateway.core import hooks
        from tokenops.store.batch_store import purge_tenant_batches
        from tokenops.store.stored_responses import purge_stored_responses

        hooks.configure(settings)  # routers learn their aliases
        names = [m.name for m in settings.models] or _demo_names()
        with Store.open(self.store_path or settings.store.path) as store:
            service = KeyService.from_settings(settings, store)
            try:
                if op == "create":
                    return admin_ops.create_key(service, args[0], lambda m: is_routable_name(m, names, hooks.get_route))
                if op == "list":
                    return admin_ops.list_keys(service, args[0])
                if op == "update":
                    return admin_ops.update_key(
                        service, args[0], args[1], lambda m: is_routable_name(m, names, hooks.get_route)
                    )
                if op == "revoke":
                    return admin_ops.revoke_key(service, args[0])
                if op == "tenant":
                    return admin_ops.put_tenant(service, args[0], args[1])[0]
                if op == "delete-tenant":
                    return admin_ops.delete_tenant(
                        service,
                        args[0],
                        set(settings.gateway.api_keys.values()),
                        lambda tenant: {
                            **hooks.forget_tenant(tenant, store),
                            **purge_stored_responses(store, tenant),
                            **purge_tenant_batches(store, tenant),
                        },
                    )
            except admin_ops.KeyOpsError as e:
                raise UserError(e.message) from None
        raise AssertionError(op)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def _demo_names() -> list[str]:
    try:
        from tokenops.backends.registry import model_configs
        from tokenops.config import Settings

        return [m.name for m in model_configs(Settings())]
    except Exception:
        return []


def _fields(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _print(data: Any, as_json: bool, line: str | None = None) -> None:
    if as_json or line is None:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        typer.echo(line)


def _money(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"


@keys_app.command("create")
def create(
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="The key's tenant (must exist).")],
    name: NameOpt = None,
    model: ModelOpt = None,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    budget_usd: BudgetOpt = None,
    budget_period: PeriodOpt = None,
    soft_budget_usd: SoftOpt = None,
    expires_at: ExpiresOpt = None,
    url: UrlOpt = None,
    admin_key: AdminKeyOpt = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a key; its secret is printed once (only its SHA-256 is kept)."""
    body = _fields(
        tenant=tenant,
        name=name,
        models=model or None,
        rpm=rpm,
        tpm=tpm,
        budget_usd=budget_usd,
        budget_period=budget_period,
        soft_budget_usd=soft_budget_usd,
        expires_at=expires_at,
    )
    target = _Target(url, admin_key, config, store)
    try:
        data = target.call("POST", "/admin/keys", "create", body, body=body)
    finally:
        target.close()
    _print(
        data,
        as_json,
        f"{data['id']}  tenant {data['tenant']}\nkey: {data['key']}\n(shown once: store it now; only its hash is kept)",
    )


@keys_app.command("list")
def list_(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant's keys.")] = None,
    url: UrlOpt = None,
    admin_key: AdminKeyOpt = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Keys with their state, limits and budget use in the current period; tenant budgets."""
    target = _Target(url, admin_key, config, store)
    try:
        data = target.call("GET", "/admin/keys", "list", tenant, params=_fields(tenant=tenant))
    finally:
        target.close()
    if as_json:
        _print(data, True)
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console() if Console().is_terminal else Console(width=160)
    table = Table(title="API keys", box=box.SIMPLE_HEAD)
    for col in ("id", "tenant", "name", "state", "models", "rpm", "tpm", "budget $", "period", "spent $", "resets"):
        table.add_column(col, justify="right" if col in ("rpm", "tpm", "budget $", "spent $") else "left")
    for k in data["keys"]:
        usage = k.get("usage") or {}
        table.add_row(
            k["id"],
            k["tenant"],
            k.get("name") or "-",
            k["state"],
            ",".join(k["models"] or ["*"]),
            _money(k["rpm"]).rstrip("0").rstrip(".") if k["rpm"] else "-",
            _money(k["tpm"]).rstrip("0").rstrip(".") if k["tpm"] else "-",
            _money(k["budget_usd"]),
            k["budget_period"] if k.get("usage") else "-",
            _money(usage.get("spent_usd")),
            usage.get("resets_at") or "-",
        )
    console.print(table)
    if data["tenants"]:
        table = Table(title="Tenants", box=box.SIMPLE_HEAD)
        for col in ("tenant", "budget $", "soft $", "period", "spent $", "resets"):
            table.add_column(col)
        for t in data["tenants"]:
            usage = t.get("usage") or {}
            table.add_row(
                t["name"],
                _money(t["budget_usd"]),
                _money(t["soft_budget_usd"]),
                t["budget_period"] if usage else "-",
                _money(usage.get("spent_usd")),
                usage.get("resets_at") or "-",
            )
        console.print(table)


@keys_app.command("update")
def update(
    key_id: Annotated[str, typer.Argument(help="The key's id (key_...).")],
    name: NameOpt = None,
    model: ModelOpt = None,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    budget_usd: BudgetOpt = None,
    budget_period: PeriodOpt = None,
    soft_budget_usd: SoftOpt = None,
    expires_at: ExpiresOpt = None,
    clear: Annotated[
        list[str] | None,
        typer.Option(
            "--clear", help="Remove a setting: models, rpm, tpm, budget_usd, soft_budget_usd, expires_at, name."
        ),
    ] = None,
    url: UrlOpt = None,
    admin_key: AdminKeyOpt = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a key's models, limits, budget, expiry or name (takes effect at the next request)."""
    body = _fields(
        name=name,
        models=model or None,
        rpm=rpm,
        tpm=tpm,
        budget_usd=budget_usd,
        budget_period=budget_period,
        soft_budget_usd=soft_budget_usd,
        expires_at=expires_at,
    )
    body.update({field: None for field in clear or []})
    target = _Target(url, admin_key, config, store)
    try:
        data = target.call("PATCH", f"/admin/keys/{key_id}", "update", key_id, body, body=body)
    finally:
        target.close()
    _print(data, as_json, f"{data['id']} updated")


@keys_app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (key_...).")],
    url: UrlOpt = None,
    admin_key: AdminKeyOpt = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a key: refused (401) from the next request on every gateway replica."""
    target = _Target(url, admin_key, config, store)
    try:
        data = target.call("DELETE", f"/admin/keys/{key_id}", "revoke", key_id)
    finally:
        target.close()
    _print(data, as_json, f"{data['id']} revoked at {data['revoked_at']}")


@keys_app.command("tenant")
def tenant(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    budget_usd: BudgetOpt = None,
    budget_period: PeriodOpt = None,
    soft_budget_usd: SoftOpt = None,
    url: UrlOpt = None,
    admin_key: AdminKeyOpt = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a tenant (keys need one) or set its spend budget, shared by all its keys."""
    body = _fields(budget_usd=budget_usd, budget_period=budget_period, soft_budget_usd=soft_budget_usd)
    target = _Target(url, admin_key, config, store)
    try:
        data = target.call("PUT", f"/admin/tenants/{name}", "tenant", name, body, body=body)
    finally:
        target.close()
    budget = (
        f"budget ${data['budget_usd']} {data['budget_period']}" if data.get("budget_usd") is not None else "no budget"
    )
    _print(data, as_json, f"tenant {data['name']}: {budget}")


@keys_app.command("delete-tenant")
def delete_tenant(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do it (without it, only say what would go).")] = False,
    url: UrlOpt = None,
    admin_key: AdminKeyOpt = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a tenant: revoke its keys, remove its budget, and purge what plugins keep for it
    (session memory, captured distillation pairs, cached answers). Spend already booked stays."""
    from tokenops.cli import UserError

    if not yes:
        raise UserError(f"deleting tenant {name!r} revokes its keys and purges its data; add --yes to do it")
    target = _Target(url, admin_key, config, store)
    try:
        data = target.call("DELETE", f"/admin/tenants/{name}", "delete-tenant", name)
    finally:
        target.close()
    purged = ", ".join(f"{what} {count}" for what, count in sorted(data["purged"].items())) or "nothing kept"
    _print(data, as_json, f"tenant {name} deleted: {len(data['revoked_keys'])} key(s) revoked; purged: {purged}")


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
