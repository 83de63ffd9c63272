"""Admin API for LoRA adapters (admin key required), mounted under ``/admin``.

- ``GET /admin/lora``: the adapters served, with their base (``parent``), folder and memory.
- ``POST /admin/lora`` ``{"name", "path", "base"?, "check_base"?}``: load a PEFT adapter folder onto
  every replica of ``base`` (default: the first bundled-engine model) and serve it as model ``name``.
  The folder must lie under ``[lora] roots`` (:mod:`tokenops.gateway.admin.lora_roots`; one 400 for any
  path outside, whether or not it exists). A bad adapter (a malformed ``adapter_config.json``,
  missing files, a rank or shape that does not fit, another base) is a 400 naming what is wrong
  and changes nothing.
- ``DELETE /admin/lora/{name}``: stop serving it (409 ``lora_in_use`` while requests run on it).

The files are read and checked off the event loop and beside the running engine loop; only adding
the adapter to the engine's set waits for the end of a step (tokenops/engine/core/async_engine.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.backends.base import Replica
from tokenops.backends.lora import LoraBackend
from tokenops.gateway.admin.lora_roots import adapter_roots, check_adapter_config, check_name, resolve_under_roots
from tokenops.gateway.edge.body import admin_body
from tokenops.gateway.errors import APIError

router = APIRouter(tags=["admin"])


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, default=str), status_code=status, media_type="application/json")


def _gateway(request: Request) -> Any:
    gw = request.app.state.gateway
    gw.admin.check(request.headers)
    return gw


def _adapters(gw: Any) -> dict[str, list[Replica]]:
    return {name: rs for name, rs in gw.replicas.items() if rs and isinstance(rs[0].backend, LoraBackend)}


def _lora(replica: Replica) -> LoraBackend:
    """The adapter backend of one of an adapter's replicas (only those are passed here)."""
    assert isinstance(replica.backend, LoraBackend), replica.name
    return replica.backend


def _card(name: str, replicas: list[Replica]) -> dict[str, Any]:
    b = _lora(replicas[0])
    return {
        "name": name,
        "parent": b.parent,
        "path": b.path,
        "loaded": all(_lora(r).is_loaded for r in replicas),
        "replicas": len(replicas),
        "resident": all(name in _lora(r).pool.resident for r in replicas),
        "bytes": (b.info or {}).get("bytes"),
        "file_bytes": (b.info or {}).get("file_bytes"),
        "rank": (b.info or {}).get("rank"),
        "targets": (b.info or {}).get("targets"),
    }


@router.get("/lora", summary="LoRA adapters served, with their base model")
async def list_lora(request: Request) -> Response:
    gw = _gateway(request)
    return _json({"adapters": [_card(n, rs) for n, rs in _adapters(gw).items()]})


def _non_empty_str(body: dict[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise APIError(400, f"'{field}' must be a non-empty string", code="invalid_value", param=field)
    return value


def _load_lock(request: Request) -> asyncio.Lock:
    """One load at a time: two requests for one name must not both pass the name check."""
    lock = getattr(request.app.state, "lora_load_lock", None)
    if lock is None:
        lock = request.app.state.lora_load_lock = asyncio.Lock()
    return lock


@router.post("/lora", summary="Load a PEFT LoRA adapter folder (under [lora] roots) and serve it as a model")
async def load_lora(request: Request) -> Response:
    gw = _gateway(request)
    body = await admin_body(request)  # the /v1 parser: size, deadline, depth, finite numbers
    unknown = sorted(set(body) - {"name", "path", "base", "check_base"})
    if unknown:
        raise APIError(
            400,
            f"unknown field {unknown[0]!r}; allowed: name, path, base, check_base",
            code="unknown_parameter",
            param=unknown[0],
        )
    name, path, base = check_name(_non_empty_str(body, "name")), _non_empty_str(body, "path"), body.get("base")
    check_base = body.get("check_base", True)
    if not isinstance(check_base, bool):
        raise APIError(400, "'check_base' must be a boolean", code="invalid_value", param="check_base")
    if base is not None and not isinstance(base, str):
        raise APIError(400, "'base' must be a model name (a string)", code="invalid_value", param="base")
    async with _load_lock(request):
        if name in gw.replicas:
            raise APIError(409, f"a model named {name!r} is already served", code="model_exists", param="name")
        base = _base_of(gw, base)
        roots = adapter_roots(gw.settings.lora.roots, getattr(gw.store, "path", None))
        folder = resolve_under_roots(path, roots)
        await asyncio.to_thread(check_adapter_config, folder)
        replicas = await _load_replicas(gw, name, str(folder), base, check_base)
        gw.replicas[name] = replicas
    return _json(_card(name, replicas), status=201)


def _base_of(gw: Any, base: str | None) -> str:
    """The bundled-engine model the adapter goes on (the first one by default)."""
    bases = [
        m
        for m, rs in gw.replicas.items()
        if rs and getattr(rs[0].backend, "kind", None) == "local" and hasattr(rs[0].backend, "started")
    ]
    # an engine that loads on demand ([gateway] max_loaded_models) would drop the adapter when evicted
    on_demand = [m for m in bases if getattr(gw.replicas[m][0].backend, "swap", None) is not None]
    bases = [m for m in bases if m not in on_demand]
    if base is None:
        base = bases[0] if bases else None
    if base in on_demand:
        raise APIError(
            400,
            f"base {base!r} is loaded on demand ([gateway] max_loaded_models) and may be evicted with its "
            f"adapters; give it lora = {{...}} in [[models]] (it then stays resident) or choose one of: "
            f"{', '.join(bases) or 'none'}",
            code="invalid_value",
            param="base",
        )
    if base is None or base not in bases:
        raise APIError(
            400,
            f"base {base!r} is not a bundled-engine model; choose one of: {', '.join(bases) or 'none'}"[:400],
            code="invalid_value",
            param="base",
        )
    return base


async def _load_replicas(gw: Any, name: str, path: str, base: str, check_base: bool) -> list[Replica]:
    """The adapter loaded on every replica of ``base``, or on none: a failure undoes the ones loaded."""
    replicas = [
        Replica(
            name=f"{name}#{r.index}",
            model=name,
            index=r.index,
            backend=LoraBackend(name, path, r.backend, r.index, check_base=check_base),
        )
        for r in gw.replicas[base]
    ]
    loaded: list[Replica] = []
    try:
        for r in replicas:
            lora = _lora(r)
            if lora.base.engine is None:
                raise ValueError(f"base replica {lora.base.name} is not loaded")
            await lora.load()
            loaded.append(r)
    except BaseException as e:  # AdapterError and friends, or anything else: undo the replicas loaded
        for r in loaded:
            await _lora(r).pool.drop(name)
        if isinstance(e, ValueError):
            raise APIError(400, str(e), code="invalid_lora_adapter", param="path") from None
        raise
    return replicas


@router.delete("/lora/{name}", summary="Stop serving a LoRA adapter")
async def unload_lora(request: Request, name: str) -> Response:
    gw = _gateway(request)
    replicas = _adapters(gw).get(name)
    if replicas is None:
        raise APIError(404, f"no LoRA adapter named {name!r} is served", code="lora_not_found", param="name")
    del gw.replicas[name]  # new requests for it are a 404 from here on
    for r in replicas:
        try:
            await _lora(r).pool.drop(name)
        except ValueError as e:  # requests run on it: serve the adapter on, as before
            gw.replicas[name] = replicas
            raise APIError(409, f"{e}; retry when they end", code="lora_in_use") from None
        _lora(r).is_loaded = False
    return _json({"name": name, "deleted": True})
