"""Admin API for managed keys and tenants (admin key required).

- ``POST /admin/keys`` ``{"tenant", "name", "models", "rpm", "tpm", "budget_usd",
  "budget_period", "soft_budget_usd", "expires_at"}`` (all but ``tenant`` optional)
  -> 201 ``{"id", "key", ...}``: the secret ``key`` appears only in this answer.
- ``GET /admin/keys`` (``?tenant=``), ``GET /admin/keys/{id}``, ``PATCH /admin/keys/{id}``
  (the same fields but ``tenant``; ``null`` clears one), ``DELETE /admin/keys/{id}`` (revoke).
- ``GET /admin/tenants``, ``PUT /admin/tenants/{name}`` ``{"budget_usd", "budget_period",
  "soft_budget_usd"}``: create a tenant or set its budget.
- ``POST /admin/budget-clock`` ``{"offset_s"}``: for tests only, with
  ``TOKENOPS_BUDGET_TEST_CLOCK=1`` in the server's environment (else 404).
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.gateway.errors import APIError
from tokenops.keys.fields import FieldError, check_tenant_name, parse_key_fields, parse_tenant_fields

router = APIRouter(tags=["admin"])


def _service(request: Request) -> Any:
    gw = request.app.state.gateway
    gw.admin.check(request.headers)
    return gw


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, default=str), status_code=status, media_type="application/json")


async def _body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(400, "the body must be a JSON object", code="invalid_json") from None


def _bad(e: FieldError) -> APIError:
    return APIError(400, str(e), code="invalid_value", param=e.param)


def is_routable(gw: Any, name: str) -> bool:
    """A served model, or a name some router accepts (``auto``, a cascade alias, ``ensemble:vote``)."""
    if name in gw.replicas:
        return True
    from tokenops.gateway import hooks
    from tokenops.types import GatewayRequest

    probe = GatewayRequest(kind="chat", model=name, body={}, messages=[{"role": "user", "content": "ping"}])
    try:
        return hooks.get_route(probe, list(gw.replicas), gw.pipeline.profiles) is not None
    except Exception:
        return False


def _key_or_404(gw: Any, key_id: str) -> Any:
    key = gw.keys.registry.get(key_id)
    if key is None:
        raise APIError(404, f"no API key with id {key_id!r}", code="key_not_found", param="id")
    return key


@router.post("/keys", summary="Create a managed API key (its secret is shown only in this answer)")
async def create_key(request: Request) -> Response:
    gw = _service(request)
    body = await _body(request)
    try:
        fields = await asyncio.to_thread(parse_key_fields, body, is_new=True,
                                         is_known_model=lambda m: is_routable(gw, m),
                                         is_known_tenant=gw.keys.registry.is_known_tenant)
    except FieldError as e:
        raise _bad(e) from None
    key, secret = await asyncio.to_thread(gw.keys.registry.create, fields)
    return _json({"id": key.id, "key": secret, **gw.keys.key_view(key)}, 201)


@router.get("/keys", summary="Managed keys with their state and budget usage; spend per tenant and key")
async def list_keys(request: Request, tenant: str | None = None) -> Response:
    gw = _service(request)

    def views() -> dict[str, Any]:
        keys = [gw.keys.key_view(k) for k in gw.keys.registry.keys() if tenant is None or k.tenant == tenant]
        tenants = [gw.keys.tenant_view(t) for t in gw.keys.registry.tenants() if tenant is None or t.name == tenant]
        return {"keys": keys, "tenants": tenants, "spend": gw.keys.spend_rows()}

    return _json(await asyncio.to_thread(views))


@router.get("/keys/{key_id}", summary="One managed key")
async def get_key(request: Request, key_id: str) -> Response:
    gw = _service(request)
    return _json(await asyncio.to_thread(gw.keys.key_view, _key_or_404(gw, key_id)))


@router.patch("/keys/{key_id}", summary="Change a key's models, limits, budget, expiry or name")
async def update_key(request: Request, key_id: str) -> Response:
    gw = _service(request)
    key = _key_or_404(gw, key_id)
    body = await _body(request)
    try:
        fields = await asyncio.to_thread(parse_key_fields, body, is_new=False,
                                         is_known_model=lambda m: is_routable(gw, m),
                                         is_known_tenant=gw.keys.registry.is_known_tenant, current=key.to_dict())
    except FieldError as e:
        raise _bad(e) from None
    if key.revoked_at is not None:
        raise APIError(409, f"API key {key_id} is revoked; create a new one", code="key_revoked")
    key = await asyncio.to_thread(gw.keys.registry.update, key_id, fields)
    return _json(gw.keys.key_view(key))


@router.delete("/keys/{key_id}", summary="Revoke a key (refused from the next request, on every replica)")
async def revoke_key(request: Request, key_id: str) -> Response:
    gw = _service(request)
    _key_or_404(gw, key_id)
    key = await asyncio.to_thread(gw.keys.registry.revoke, key_id)
    return _json(gw.keys.key_view(key))


@router.get("/tenants", summary="Tenants with their budgets and usage")
async def list_tenants(request: Request) -> Response:
    gw = _service(request)
    names = sorted(set(gw.settings.gateway.api_keys.values()) | {k.tenant for k in gw.keys.registry.keys()})
    known = {t.name for t in gw.keys.registry.tenants()}
    views = [gw.keys.tenant_view(t) for t in gw.keys.registry.tenants()]
    views += [{"name": n, "budget_usd": None, "budget_period": None, "soft_budget_usd": None} for n in names
              if n not in known]
    return _json({"tenants": sorted(views, key=lambda v: v["name"])})


@router.put("/tenants/{name}", summary="Create a tenant or set its spend budget")
async def put_tenant(request: Request, name: str) -> Response:
    gw = _service(request)
    body = await _body(request)
    current = gw.keys.registry.tenant(name)
    try:
        check_tenant_name(name)
        fields = parse_tenant_fields(body, current.to_dict() if current else None)
    except FieldError as e:
        raise _bad(e) from None
    tenant = await asyncio.to_thread(gw.keys.registry.put_tenant, name, fields)
    return _json(gw.keys.tenant_view(tenant), 200 if current else 201)


@router.post("/budget-clock", summary="Tests only: move the budget clock (TOKENOPS_BUDGET_TEST_CLOCK=1)",
             include_in_schema=False)
async def budget_clock(request: Request) -> Response:
    gw = _service(request)
    if not gw.keys.is_test_clock_enabled:
        raise APIError(404, f"Unknown path {request.url.path}")
    body = await _body(request)
    offset = body.get("offset_s") if isinstance(body, dict) else None
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
        raise APIError(400, "offset_s must be a finite number of seconds", code="invalid_value", param="offset_s")
    gw.keys.registry.clock.offset_s = float(offset)
    return _json({"offset_s": float(offset), "now": gw.keys.registry.clock()})
