"""The key and tenant operations of the admin API, as plain functions over a
:class:`KeyService`, so ``tokenops keys`` can run them on the store when no
server runs (the server's endpoints answer the same documents).

:class:`KeyOpsError` carries the HTTP status the API answers with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenops.keys.admin_fields import FieldError, check_tenant_name, parse_key_fields, parse_tenant_fields


class KeyOpsError(Exception):
    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def _bad(e: FieldError) -> KeyOpsError:
    return KeyOpsError(e.status, str(e), e.code, e.param)


def _key(keys: Any, key_id: str) -> Any:
    key = keys.registry.get(key_id)
    if key is None:
        raise KeyOpsError(404, f"no API key with id {key_id!r}", "key_not_found", "id")
    return key


def create_key(keys: Any, body: Any, is_known_model: Callable[[str], bool]) -> dict[str, Any]:
    try:
        fields = parse_key_fields(
            body, is_new=True, is_known_model=is_known_model, is_known_tenant=keys.registry.is_known_tenant
        )
    except FieldError as e:
        raise _bad(e) from None
    key, secret = keys.registry.create(fields)
    return {"id": key.id, "key": secret, **keys.key_view(key)}


def list_keys(keys: Any, tenant: str | None = None) -> dict[str, Any]:
    return {
        "keys": [keys.key_view(k) for k in keys.registry.keys() if tenant is None or k.tenant == tenant],
        "tenants": [keys.tenant_view(t) for t in keys.registry.tenants() if tenant is None or t.name == tenant],
        "spend": keys.spend_rows(),
    }


def get_key(keys: Any, key_id: str) -> dict[str, Any]:
    return keys.key_view(_key(keys, key_id))


def update_key(keys: Any, key_id: str, body: Any, is_known_model: Callable[[str], bool]) -> dict[str, Any]:
    key = _key(keys, key_id)
    try:
        fields = parse_key_fields(
            body,
            is_new=False,
            is_known_model=is_known_model,
            is_known_tenant=keys.registry.is_known_tenant,
            current=key.to_dict(),
        )
    except FieldError as e:
        raise _bad(e) from None
    if key.revoked_at is not None:
        raise KeyOpsError(409, f"API key {key_id} is revoked; create a new one", "key_revoked")
    return keys.key_view(keys.registry.update(key_id, fields))


def revoke_key(keys: Any, key_id: str) -> dict[str, Any]:
    _key(keys, key_id)
    return keys.key_view(keys.registry.revoke(key_id))


def put_tenant(keys: Any, name: str, body: Any) -> tuple[dict[str, Any], bool]:
    """The tenant's view and whether it was created."""
    current = keys.registry.tenant(name)
    try:
        check_tenant_name(name)
        fields = parse_tenant_fields(body, current.to_dict() if current else None)
    except FieldError as e:
        raise _bad(e) from None
    return keys.tenant_view(keys.registry.put_tenant(name, fields)), current is None


def delete_tenant(
    keys: Any, name: str, config_tenants: set[str], forget: Callable[[str], dict[str, int]]
) -> dict[str, Any]:
    """Delete a tenant: revoke its keys, drop its record and budget, then ``forget``
    (every plugin deletes what it keeps for it: session memory, captured pairs, ...)."""
    if name in config_tenants:
        raise KeyOpsError(
            409,
            f"tenant {name!r} comes from [gateway] api_keys in the config; remove it there "
            "and restart (nothing was deleted)",
            "tenant_in_config",
            "name",
        )
    if not keys.registry.is_known_tenant(name):
        raise KeyOpsError(404, f"no tenant {name!r}", "tenant_not_found", "name")
    revoked = keys.registry.delete_tenant(name)
    return {"tenant": name, "deleted": True, "revoked_keys": revoked, "purged": forget(name)}


def list_tenants(keys: Any, config_tenants: set[str]) -> list[dict[str, Any]]:
    known = {t.name for t in keys.registry.tenants()}
    views = [keys.tenant_view(t) for t in keys.registry.tenants()]
    names = (config_tenants | {k.tenant for k in keys.registry.keys() if k.revoked_at is None}) - known
    views += [{"name": n, "budget_usd": None, "budget_period": None, "soft_budget_usd": None} for n in names]
    return sorted(views, key=lambda v: v["name"])
