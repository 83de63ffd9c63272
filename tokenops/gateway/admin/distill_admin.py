"""Admin API of captured distillation pairs (``distill_pairs``): count and delete per tenant.

``GET /admin/distill/pairs`` -> counts per tenant and model; ``DELETE
/admin/distill/pairs?tenant=NAME`` deletes that tenant's pairs (the same as ``tokenops
distill purge --tenant NAME``). Both need the admin key."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from tokenops.gateway.errors import APIError

router = APIRouter(prefix="/admin/distill", tags=["admin"])


def _store(request: Request) -> Any:
    gw = request.app.state.gateway
    gw.admin.check(request.headers)
    if gw.store is None:
        raise APIError(409, "this server runs without a store (--no-store): no captured pairs")
    return gw.store


def _json(data: Any) -> Response:
    return Response(json.dumps(data), media_type="application/json")


def _flush(request: Request) -> None:
    """Queued captures land before the query, so a purge leaves none behind."""
    from tokenops.store import sink

    writer = sink.current()
    if writer is not None:
        writer.flush()


@router.get("/pairs", summary="Captured distillation pairs per tenant and model")
async def list_pairs(request: Request) -> Response:
    store = _store(request)
    await asyncio.to_thread(_flush, request)
    rows = await asyncio.to_thread(
        lambda: store.execute("SELECT tenant, model, count(*) FROM distill_pairs GROUP BY ALL ORDER BY ALL").fetchall()
    )
    return _json({"pairs": [{"tenant": t, "model": m, "count": c} for t, m, c in rows]})


@router.delete("/pairs", summary="Delete one tenant's captured distillation pairs")
async def delete_pairs(request: Request, tenant: str = Query(..., min_length=1)) -> Response:
    store = _store(request)

    from tokenops.store.distill_pairs import delete_local

    deleted = await asyncio.to_thread(delete_local, store, tenant=tenant)
    return _json({"tenant": tenant, "deleted": deleted})
