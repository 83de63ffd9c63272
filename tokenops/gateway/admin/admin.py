"""The admin API (``/admin/...``, admin key required): stats, tunables, recent
requests and named store queries. See ``docs`` and the admin contract."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from tokenops.gateway.admin.tunable_patch import apply_everywhere
from tokenops.gateway.core import hooks
from tokenops.gateway.edge.body import admin_body, check_depth, read_body
from tokenops.gateway.errors import APIError
from tokenops.gateway.state import RECENT_REQUESTS, Gateway
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
    from tokenops.plugin_manager import get_launchers, get_tunables

    # knobs of external engines (vllm.*, sglang.*) exist only as their launch flags for
    # `tokenops tune --engine ...`; this server has nothing to show or set for them
    foreign = tuple(
        p for name, launcher in get_launchers().items() if name != "tokenops" for p in getattr(launcher, "prefixes", ())
    )
    return [
        {
            **t.to_dict(),
            "value": gw.tunable_values.get(t.name, t.default),
            **({"per_model": gw.tunables_per_model[t.name]} if t.name in gw.tunables_per_model else {}),
        }
        for t in get_tunables()
        if not (foreign and t.name.startswith(foreign))
    ]


def deployment_facts(gw: Gateway) -> dict[str, Any]:
    """What ``tokenops tune`` needs to know to search only tunables that can act here; the
    store channel's ``hello`` carries the same object (one builder for both paths)."""
    from tokenops.tune.deployment import server_facts

    return server_facts(
        gw.settings, {m: len(r) for m, r in gw.replicas.items()}, {name: m.backend for name, m in gw.models.items()}
    )


@router.get(
    "/tunables",
    summary="Every tunable in the registry with its current value, and the deployment facts "
    "that decide which of them can act",
)
async def get_tunables_route(request: Request) -> Response:
    gw = _gateway(request)
    return _json({"tunables": _tunables_list(gw), "deployment": deployment_facts(gw)})


@router.patch("/tunables", summary="Apply live tunables to every replica (validated as a whole, audited)")
async def patch_tunables(request: Request) -> Response:
    gw = _gateway(request)
    try:
        body = await admin_body(request)  # refuses NaN/Infinity, which json.loads would accept
    except APIError as e:
        raise APIError(
            400, f'{e.message} The body must be {{"values": {{name: value}}, "actor": str}}.', code="invalid_json"
        ) from None
    values = body.get("values") if isinstance(body, dict) else None
    if not isinstance(values, dict) or not values:
        raise APIError(
            400,
            'the body needs a non-empty "values" object: {"values": {"engine.max_num_seqs": 16}}',
            code="invalid_value",
            param="values",
        )
    unknown = sorted(set(body) - {"values", "actor"})
    if unknown:
        raise APIError(
            400,
            f"unknown field(s) {', '.join(map(repr, unknown))[:200]}; the body takes values and actor",
            code="invalid_value",
            param=unknown[0][:64],
        )
    actor = body.get("actor", "admin")
    if not isinstance(actor, str):
        raise APIError(
            400, "actor must be a string (who made the change, for the audit)", code="invalid_value", param="actor"
        )
    applied = await asyncio.to_thread(apply_tunables, gw, values, str(actor))
    return _json({"applied": applied, "tunables": _tunables_list(gw)})


def apply_tunables(gw: Gateway, values: dict[str, Any], actor: str) -> dict[str, Any]:
    """Validate the whole patch, refuse restart-only names, apply, audit."""
    from tokenops.plugin_manager import get_tunables

    registry = get_tunables()
    for name, value in values.items():  # over HTTP a value has its JSON type or is text (1 is no bool)
        t = registry.get(name)  # unknown names (None): the registry says which exist
        if t is not None and not _is_json_type(t.type, value):
            raise APIError(
                400, f"{name}: expected a JSON {t.type}, got {value!r}"[:300], code="invalid_tunable", param=name
            )
    try:
        checked = registry.validate(values)
    except TunableError as e:
        raise APIError(400, str(e), code="invalid_tunable") from None
    restart = [name for name in checked if not registry[name].live]
    if restart:
        raise APIError(
            400,
            f"{', '.join(restart)} cannot change live: it needs a restart (set it in tokenops.toml "
            "and restart the server)",
            code="restart_required",
        )
    old = {k: gw.tunable_values.get(k, registry[k].default) for k in checked}
    try:  # every replica and plugin, or none of them (tokenops.gateway.admin.tunable_patch)
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


def apply_when_ready(gw: Any, values: dict[str, Any], actor: str, timeout_s: float = 900.0) -> None:
    """Apply live ``values`` (as ``PATCH /admin/tunables`` would) once the gateway has started,
    from a daemon thread, so start-up is not delayed; a failure is logged (``serve --engine-profile``)."""

    def run() -> None:
        deadline = time.monotonic() + timeout_s
        while not gw.is_ready and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            with gw.scope():  # a thread of its own: this gateway's plugin instances take the values
                apply_tunables(gw, values, actor)
        except Exception as e:
            log.error("profile tunables %s not applied: %s", ", ".join(values), getattr(e, "message", e))

    threading.Thread(target=run, name="tokenops-profile-tunables", daemon=True).start()


def _is_json_type(kind: str, value: Any) -> bool:
    """The tunable's own JSON type, or a string the registry parses (the dashboard's
    editor sends what was typed); never a boolean for a number or a number for a boolean."""
    if isinstance(value, str):
        return True
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return not isinstance(value, bool) and (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        )
    if kind == "float":
        return not isinstance(value, bool) and isinstance(value, (int, float))
    return isinstance(value, str)


@router.post("/store/rows", summary="Append bench/tune runs measured against this server to its store")
async def add_store_rows(request: Request) -> Response:
    """``tokenops bench --url`` / ``tune --url`` from another folder save their runs here, so this
    server's ``tokenops report`` lists them (tokenops/store/run_target.py)."""
    from tokenops.store import wire
    from tokenops.store.remote import model_class
    from tokenops.store.run_target import RUN_TABLES

    gw = _gateway(request)
    if gw.store is None:
        raise APIError(503, "this server runs without a store", code="store_unavailable")
    # the store's wire format (NaN for a missing figure, tagged dates), read with the /v1 body's size
    # limit and deadline and parsed off the loop; too deep a body is a 400 like a malformed one
    raw = await read_body(request, 8 * 1024 * 1024, 30.0)
    await asyncio.to_thread(check_depth, raw)  # the same depth limit as every other body
    try:
        objects = (await asyncio.to_thread(wire.decode, raw))["objects"]
        assert isinstance(objects, list)
    except (ValueError, KeyError, TypeError, AssertionError, RecursionError):
        raise APIError(400, 'body must be {"objects": [{"table": ..., "values": {...}}]}', param="objects") from None
    rows = []
    for i, item in enumerate(objects):
        table = item.get("table") if isinstance(item, dict) else None
        if not isinstance(table, str) or table not in RUN_TABLES:
            raise APIError(
                400,
                f"objects[{i}].table {table!r}: only {', '.join(sorted(RUN_TABLES))} take rows here",
                param=f"objects[{i}].table",
            )
        try:
            # validated: a table model's constructor alone checks nothing (SQLModel), and a row the
            # store then refuses would be a 500
            rows.append(model_class(table).model_validate(item["values"]))
        except (KeyError, TypeError, ValueError) as e:
            first = str(e).splitlines()[:3]
            raise APIError(400, f"objects[{i}].values: {' '.join(first)}", param=f"objects[{i}].values") from None
    try:
        await asyncio.to_thread(gw.store.add, *rows)
    except Exception as e:  # a constraint of the table (a repeated id, a missing column)
        raise APIError(
            400, f"the store refused the rows: {type(e).__name__}: {str(e).splitlines()[0][:200]}", param="objects"
        ) from None
    return _json({"added": len(rows)})


@router.get(
    "/requests",
    summary="Most recent requests, newest first: this process's and the store's (the list survives restarts)",
)
async def recent_requests(request: Request, limit: int = Query(50, ge=1, le=RECENT_REQUESTS)) -> Response:
    gw = _gateway(request)
    items = [r.summary() for r in reversed(list(gw.recent)[-limit:])]
    if gw.store is not None and hasattr(gw.store, "execute"):
        from tokenops.store.request_history import latest_requests, merge_newest

        try:  # the requests of earlier runs; the ones in memory may not be flushed yet
            stored = await asyncio.to_thread(latest_requests, gw.store, limit)
        except Exception as e:  # the store is the history, not the request path: say so, answer from memory
            log.warning("GET /admin/requests: the store's requests could not be read: %s", e)
        else:
            items = merge_newest(items, stored, limit)
    return _json({"requests": items})


@router.get("/query/{name}", summary="Run a named store query (parameters as query string)")
async def store_query(request: Request, name: str) -> Response:
    gw = _gateway(request)
    if gw.store is None:
        raise APIError(503, "this server runs without a store", code="store_unavailable")
    from tokenops.store.queries import QUERIES, QueryError

    if name not in QUERIES:
        raise APIError(
            404,
            f"unknown query {name!r}; named queries: {', '.join(sorted(QUERIES))}",
            code="unknown_query",
            param="name",
        )
    params = dict(request.query_params)
    try:
        result = await asyncio.to_thread(gw.store.run_query, name, **params)
    except (QueryError, TypeError, ValueError, OverflowError) as e:
        raise APIError(400, str(e), code="invalid_value") from None
    return _json(_query_result(name, result))


def _query_result(name: str, result: Any) -> dict[str, Any]:
    if isinstance(result, dict) and "columns" in result and "rows" in result:
        return {"name": name, "columns": list(result["columns"]), "rows": [list(r) for r in result["rows"]]}
    if isinstance(result, dict):  # column -> values
        columns = list(result)
        return {"name": name, "columns": columns, "rows": [list(r) for r in zip(*result.values())]}
    raise TypeError(f"unexpected query result of {name}: {type(result).__name__}")


from tokenops.gateway.admin.admin_managed_keys import router as _keys_router  # noqa: E402  (/admin/keys, /admin/tenants)

router.include_router(_keys_router)
from tokenops.gateway.admin.admin_memory import router as _memory_router  # noqa: E402  (/admin/memory)

router.include_router(_memory_router)
from tokenops.gateway.admin.gateways_admin import router as _gateways_router  # noqa: E402  (/admin/gateways)

router.include_router(_gateways_router)
from tokenops.gateway.admin.admin_lora import router as _lora_router  # noqa: E402  (/admin/lora)

router.include_router(_lora_router)
