"""What the Files and Batch APIs share: the tenant of a request, a file or batch of that tenant
(another tenant's is a 404), OpenAI's list page and the JSON answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from fastapi import Request
from starlette.responses import Response

from tokenops.gateway.batches.batch_state import batch_store
from tokenops.gateway.errors import APIError
from tokenops.gateway.intake import caller

_JSON = "application/json"


def tenant_of(request: Request, is_write: bool = False) -> tuple[Any, str, str | None]:
    """``(gateway, tenant, key id)`` of a Batch or Files API request (a 401 without a valid key)."""
    who = caller(request, is_write=is_write)
    return who.gateway, who.tenant, who.key_id


def dumps(value: Any, status: int = 200) -> Response:
    return Response(json.dumps(value, separators=(",", ":")), status_code=status, media_type=_JSON)


def not_found(kind: str, object_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No {kind} found with id {object_id!r}.", code=f"{kind}_not_found", param=param)


def error_response(description: str) -> dict[str, Any]:
    """An error status a route declares beside the common ones (tokenops/gateway/edge/openapi_errors.py)."""
    ref = {"$ref": "#/components/schemas/ErrorResponse"}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


async def tenant_row(request: Request, kind: Literal["file", "batch"], object_id: str) -> tuple[str, dict[str, Any]]:
    """``(tenant, row)`` of the request's tenant's file or batch ``object_id``; a 404 when it has none."""
    _, tenant, _ = tenant_of(request)
    store = batch_store(request.app)
    lookup = store.file if kind == "file" else store.batch
    row = await asyncio.to_thread(lookup, tenant, object_id)
    if row is None:
        raise not_found(kind, object_id)
    return tenant, row


def list_page(data: list[dict[str, Any]], has_more: bool) -> Response:
    """OpenAI's list object of ``data`` (one page)."""
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return dumps({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more})
