"""Admin API for managed keys and tenants (admin key required), mounted under ``/admin``.

- ``POST /admin/keys`` ``{"tenant", "name", "models", "rpm", "tpm", "budget_usd",
  "budget_period", "soft_budget_usd", "expires_at"}`` (all but ``tenant`` optional)
  -> 201 ``{"id", "key", ...}``: the secret ``key`` appears only in this answer.
- ``GET /admin/keys`` (``?tenant=``), ``GET /admin/keys/{id}``, ``PATCH /admin/keys/{id}``
  (the same fields but ``tenant``; ``null`` clears one), ``DELETE /admin/keys/{id}`` (revoke).
- ``GET /admin/tenants``, ``PUT /admin/tenants/{name}`` ``{"budget_usd", "budget_period",
  "soft_budget_usd"}``: create a tenant or set its budget.
- ``DELETE /admin/tenants/{name}``: delete a tenant: its keys are revoked, its budget
  record removed, and every plugin forgets its data (session memory, captured
  distillation pairs; ``tokenops_tenant_deleted``), its stored responses, files and batches
  (a running batch stops first; file bytes go too); answers what was revoked and purged.
- ``POST /admin/budget-clock`` ``{"offset_s"}``: for tests only, with
  ``TOKENOPS_BUDGET_TEST_CLOCK=1`` in the server's environment (else 404).

The operations themselves are :mod:`tokenops.keys.admin_ops` (``tokenops keys``
runs them on the store when no server runs).
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.gateway.edge.body import admin_body
from tokenops.gateway.errors import APIError
from tokenops.keys import admin_ops
from tokenops.keys.admin_ops import KeyOpsError

router = APIRouter(tags=["admin"])


def _gateway(request: Request) -> Any:
    gw = request.app.state.gateway
    gw.admin.check(request.headers)
    return gw


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, default=str), status_code=status, media_type="application/json")


async def _body(request: Request) -> Any:
    return await admin_body(request)  # the /v1 parser's limits (depth, size, NaN, 64-bit integers)


async def _run(fn, *args: Any) -> Any:
    """An operation on ``args[0]`` (the key service) off the event loop (it writes the
    store and may talk to Redis)."""

    def run() -> Any:
        args[0].registry.refresh()  # what another replica changed (with Redis) counts here too
        return fn(*args)

    try:
        return await asyncio.to_thread(run)
    except KeyOpsError as e:
        raise APIError(e.status, e.message, code=e.code, param=e.param) from None


def is_routable(gw: Any, name: str) -> bool:
    """A served model, or a name some router accepts (``auto``, a cascade alias, ``ensemble:vote``)."""
    if name in gw.replicas:
        return True
    from tokenops.gateway.core import hooks
    from tokenops.keys.models import is_routable_name

    return is_routable_name(name, list(gw.replicas), hooks.get_route, gw.pipeline.profiles)


@router.post("/keys", summary="Create a managed API key (its secret is shown only in this answer)")
async def create_key(request: Request) -> Response:
    gw = _gateway(request)
    body = await _body(request)
    return _json(await _run(admin_ops.create_key, gw.keys, body, lambda m: is_routable(gw, m)), 201)


@router.get("/keys", summary="Managed keys with their state and budget usage; spend per tenant and key")
async def list_keys(request: Request, tenant: str | None = None) -> Response:
    gw = _gateway(request)
    return _json(await _run(admin_ops.list_keys, gw.keys, tenant))


@router.get("/keys/{key_id}", summary="One managed key")
async def get_key(request: Request, key_id: str) -> Response:
    gw = _gateway(request)
    return _json(await _run(admin_ops.get_key, gw.keys, key_id))


@router.patch("/keys/{key_id}", summary="Change a key's models, limits, budget, expiry or name")
async def update_key(request: Request, key_id: str) -> Response:
    gw = _gateway(request)
    body = await _body(request)
    return _json(await _run(admin_ops.update_key, gw.keys, key_id, body, lambda m: is_routable(gw, m)))


@router.delete("/keys/{key_id}", summary="Revoke a key (refused from the next request, on every replica)")
async def revoke_key(request: Request, key_id: str) -> Response:
    gw = _gateway(request)
    return _json(await _run(admin_ops.revoke_key, gw.keys, key_id))


@router.get("/tenants", summary="Tenants with their budgets and usage")
async def list_tenants(request: Request) -> Response:
    gw = _gateway(request)
    config_tenants = set(gw.settings.gateway.api_keys.values())
    return _json({"tenants": await _run(admin_ops.list_tenants, gw.keys, config_tenants)})


@router.put("/tenants/{name}", summary="Create a tenant or set its spend budget")
async def put_tenant(request: Request, name: str) -> Response:
    gw = _gateway(request)
    body = await _body(request)
    view, is_new = await _run(admin_ops.put_tenant, gw.keys, name, body)
    return _json(view, 201 if is_new else 200)


@router.delete("/tenants/{name}", summary="Delete a tenant: revoke its keys, remove its budget, purge its data")
async def delete_tenant(request: Request, name: str) -> Response:
    gw = _gateway(request)
    config_tenants = set(gw.settings.gateway.api_keys.values())
    from tokenops.gateway.batches.batch_state import purge_tenant as purge_batches
    from tokenops.gateway.core import hooks
    from tokenops.gateway.responses.responses_api import purge_tenant as purge_responses

    return _json(
        await _run(
            admin_ops.delete_tenant,
            gw.keys,
            name,
            config_tenants,
            lambda tenant: {
                **hooks.forget_tenant(tenant, gw.store),
                **purge_responses(request.app, tenant),
                **purge_batches(request.app, tenant),
            },
        )
    )


@router.post(
    "/budget-clock", summary="Tests only: move the budget clock (TOKENOPS_BUDGET_TEST_CLOCK=1)", include_in_schema=False
)
async def budget_clock(request: Request) -> Response:
    gw = _gateway(request)
    if not gw.keys.is_test_clock_enabled:
        raise APIError(404, f"Unknown path {request.url.path}")
    body = await _body(request)
    offset = body.get("offset_s") if isinstance(body, dict) else None
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
        raise APIError(400, "offset_s must be a finite number of seconds", code="invalid_value", param="offset_s")
    gw.keys.registry.clock.offset_s = float(offset)
    return _json({"offset_s": float(offset), "now": gw.keys.registry.clock()})
