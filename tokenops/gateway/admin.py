"""The admin API (``/admin/...``, admin key required): stats, tunables, recent
requests and named store queries. See ``docs`` and the admin contract."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.gateway import hooks
from tokenops.gateway.body import parse_json
from tokenops.gateway.errors import APIError
from tokenops.gateway.state import Gateway
from tokenops.gateway.tunable_patch import apply_everywhere
from tokenops.tunables import TunableError

log = logging.getLogger("tokenops.gateway")
router = APIRouter(prefix="/admin", tags=["admin"])


def _gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    gw.admin.check(request.headers)
    return gw


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, default=str), status_code=status, media_type="application/json")


@router.get("/stats", summary="Live snapshot: rates, latency percentiles, SLOs, engines, models, history")
async def admin_stats(request: Request) -> Response:
    gw = _gateway(request)
    return _json(await asyncio.to_thread(gw.stats))


def _tunables_list(gw: Gateway) -> list[dict[str, Any]]:
    from tokenops.plugins import get_launchers, get_tunables

    # knobs of external engines (vllm.*, sglang.*) exist only as their launch flags for
    # `tokenops tune --engine ...`; this server has nothing to show or set for them
    foreign = tuple(p for name, launcher in get_launchers().items() if name != "tokenops"
                    for p in getattr(launcher, "prefixes", ()))
    return [{**t.to_dict(), "value": gw.tunable_values.get(t.name, t.default),
             **({"per_model": gw.tunables_per_model[t.name]} if t.name in gw.tunables_per_model else {})}
            for t in get_tunables() if not (foreign and t.name.startswith(foreign))]


@router.get("/tunables", summary="Every tunable in the registry with its current value")
async def get_tunables_route(request: Request) -> Response:
    gw = _gateway(request)
    return _json({"tunables": _tunables_list(gw)})


@router.patch("/tunables", summary="Apply live tunables to every replica (validated as a whole, audited)")
async def patch_tunables(request: Request) -> Response:
    gw = _gateway(request)
    try:
        body = parse_json(await request.body())  # refuses NaN/Infinity, which json.loads would accept
    except APIError as e:
        raise APIError(400, f"{e.message} The body must be {{\"values\": {{name: value}}, \"actor\": str}}.",
                       code="invalid_json") from None
    values = body.get("values") if isinstance(body, dict) else None
    if not isinstance(values, dict) or not values:
        raise APIError(400, "the body needs a non-empty \"values\" object: {\"values\": {\"engine.max_num_seqs\": 16}}",
                       code="invalid_value", param="values")
    actor = body.get("actor") or "admin"
    applied = await asyncio.to_thread(apply_tunables, gw, values, str(actor))
    return _json({"applied": applied, "tunables": _tunables_list(gw)})


def apply_tunables(gw: Gateway, values: dict[str, Any], actor: str) -> dict[str, Any]:
    """Validate the whole patch, refuse restart-only names, apply, audit."""
    from tokenops.plugins import get_tunables

    registry = get_tunables()
    try:
        checked = registry.validate(values)
    except TunableError as e:
        raise APIError(400, str(e), code="invalid_tunable") from None
    restart = [name for name in checked if not registry[name].live]
    if restart:
        raise APIError(400, f"{', '.join(restart)} cannot change live: it needs a restart (set it in tokenops.toml "
                       "and restart the server)", code="restart_required")
    old = {k: gw.tunable_values.get(k, registry[k].default) for k in checked}
    try:  # every replica and plugin, or none of them (tokenops.gateway.tunable_patch)
        apply_everywhere([r for rs in gw.replicas.values() for r in rs], checked, old, hooks.apply_plugin_tunables)
    except TunableError as e:
        raise APIError(400, str(e), code="invalid_tunable") from None
    gw.tunable_values.update(checked)
    if gw.store is not None:
        for name, value in checked.items():
            if old[name] == value:  # a patch that restores or repeats a value is no change to audit
                continue
            try:
                gw.store.record_config_change(name, old[name], value, actor=actor, source="admin")
            except Exception as e:  # the change is live; a failed audit must be visible, not fatal
                log.error("audit of %s failed: %s", name, e)
    return checked


@router.get("/requests", summary="Most recent requests, newest first (memory ring, not the store)")
async def recent_requests(request: Request, limit: int = 50) -> Response:
    gw = _gateway(request)
    if limit < 1:
        raise APIError(400, "limit must be >= 1", param="limit")
    items = list(gw.recent)[-limit:]
    return _json({"requests": [r.summary() for r in reversed(items)]})


@router.get("/query/{name}", summary="Run a named store query (parameters as query string)")
async def store_query(request: Request, name: str) -> Response:
    gw = _gateway(request)
    if gw.store is None:
        raise APIError(503, "this server runs without a store", code="store_unavailable")
    from tokenops.store.queries import QUERIES, QueryError

    if name not in QUERIES:
        raise APIError(404, f"unknown query {name!r}; named queries: {', '.join(sorted(QUERIES))}",
                       code="unknown_query", param="name")
    params = dict(request.query_params)
    try:
        result = await asyncio.to_thread(gw.store.run_query, name, **params)
    except (QueryError, TypeError, ValueError) as e:
        raise APIError(400, str(e), code="invalid_value") from None
    return _json(_query_result(name, result))


def _query_result(name: str, result: Any) -> dict[str, Any]:
    if isinstance(result, dict) and "columns" in result and "rows" in result:
        return {"name": name, "columns": list(result["columns"]), "rows": [list(r) for r in result["rows"]]}
    if isinstance(result, dict):  # column -> values
        columns = list(result)
        return {"name": name, "columns": columns, "rows": [list(r) for r in zip(*result.values())]}
    raise TypeError(f"unexpected query result of {name}: {type(result).__name__}")


from tokenops.gateway.admin_keys import router as _keys_router  # noqa: E402  (/admin/keys, /admin/tenants)

router.include_router(_keys_router)
from tokenops.gateway.admin_memory import router as _memory_router  # noqa: E402  (/admin/memory)

router.include_router(_memory_router)
from tokenops.gateway.admin_lora import router as _lora_router  # noqa: E402  (/admin/lora)

router.include_router(_lora_router)
