"""OpenAI's Batch API: ``POST /v1/batches``, ``GET /v1/batches``, ``GET /v1/batches/{id}``,
``POST /v1/batches/{id}/cancel``. Per tenant (the same API keys as every ``/v1`` route):
another tenant's batch is a 404. The work is done by the runner (:mod:`.batch_runner`)."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.responses import Response

from tokenops.gateway.batches.batch_lines import ENDPOINTS
from tokenops.gateway.batches.batch_runner import expiry
from tokenops.gateway.batches.batch_state import batch_object, batch_runner, batch_store, window_seconds
from tokenops.gateway.batches.file_expiry import ExpiresAfter
from tokenops.gateway.batches.tenant_rows import dumps, error_response, list_page, not_found, tenant_of, tenant_row
from tokenops.gateway.edge.body import parse_json, read_body
from tokenops.gateway.errors import APIError
from tokenops.gateway.openai.metadata_bounds import Metadata
from tokenops.store.batch_store import new_id
from tokenops.store.migrations import utcnow

router = APIRouter()
_CANCELLABLE = ("validating", "in_progress")


class CreateBatch(BaseModel):
    """The body of ``POST /v1/batches``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input_file_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
    #: "24h" (OpenAI); tokenops also takes <N>h, <N>m and <N>s (docs/batches.md)
    completion_window: str
    metadata: Metadata | None = None
    #: the output and error files expire ``seconds`` after they are recorded (:mod:`.file_expiry`)
    output_expires_after: ExpiresAfter | None = None


def _create_body() -> dict[str, Any]:
    schema = CreateBatch.model_json_schema()
    schema = _inline(schema, schema.pop("$defs", {}))  # a "#/$defs/..." ref does not resolve in the OpenAPI document
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with each ``{"$ref": "#/$defs/X"}`` replaced by ``defs["X"]``."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _parse(raw: bytes) -> CreateBatch:
    data = parse_json(raw)
    try:
        return CreateBatch.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        hint = f" (one of {', '.join(ENDPOINTS)})" if loc == "endpoint" else ""
        raise APIError(
            400, f"{loc}: {err.get('msg', 'invalid value')}{hint}", code="invalid_value", param=loc or None
        ) from None


@router.post(
    "/v1/batches",
    tags=["batches"],
    summary="Create a batch from an uploaded JSONL file",
    openapi_extra=_create_body(),
)
async def create_batch(request: Request) -> Response:
    gw, tenant, key_id = tenant_of(request, is_write=True)
    conf = gw.settings.gateway
    body = _parse(await read_body(request, conf.max_body_bytes, conf.body_timeout_s))
    window_s = window_seconds(body.completion_window)
    store = batch_store(request.app)
    found = await asyncio.to_thread(store.file, tenant, body.input_file_id)
    if found is None:
        raise not_found("file", body.input_file_id, "input_file_id")
    if found["purpose"] != "batch":
        raise APIError(
            400, f"input_file_id: the file's purpose is {found['purpose']!r}; upload the input with purpose \"batch\"",
            code="invalid_value", param="input_file_id",
        )  # fmt: skip
    now = utcnow()
    row = {
        "id": new_id("batch_"), "tenant": tenant, "api_key_id": key_id, "endpoint": body.endpoint,
        "input_file_id": body.input_file_id, "completion_window": body.completion_window, "window_s": window_s,
        "status": "validating", "metadata_json": body.metadata, "num_total": found["num_lines"],
        "num_completed": 0, "num_failed": 0, "created_at": now, "expires_at": expiry(now, window_s),
        "output_expires_s": body.output_expires_after.seconds if body.output_expires_after else None,
    }  # fmt: skip
    created = await asyncio.to_thread(store.add_batch, row)
    runner = batch_runner(request.app)
    runner.start()  # started with the app when it has a store; else with its first batch
    runner.wake()
    return dumps(batch_object(created))


@router.get("/v1/batches", tags=["batches"], summary="This tenant's batches, newest first")
async def list_batches(
    request: Request, after: str | None = Query(None, max_length=200), limit: int = Query(20, ge=1, le=100)
) -> Response:
    _, tenant, _ = tenant_of(request)
    rows = await asyncio.to_thread(batch_store(request.app).batches, tenant, after, limit + 1)
    runner = batch_runner(request.app)
    data = [batch_object(r, runner.live_counts(r["id"])) for r in rows[:limit]]
    return list_page(data, len(rows) > limit)


@router.get("/v1/batches/{batch_id}", tags=["batches"], summary="A batch of this tenant")
async def retrieve_batch(request: Request, batch_id: str) -> Response:
    _, row = await tenant_row(request, "batch", batch_id)
    return dumps(batch_object(row, batch_runner(request.app).live_counts(batch_id)))


@router.post(
    "/v1/batches/{batch_id}/cancel",
    tags=["batches"],
    summary="Cancel a batch (lines in flight too)",
    openapi_extra={"responses": {"409": error_response("The batch has finished (or is finalizing)")}},
)
async def cancel_batch(request: Request, batch_id: str) -> Response:
    _, row = await tenant_row(request, "batch", batch_id)
    runner = batch_runner(request.app)
    if row["status"] in ("cancelling", "cancelled"):
        return dumps(batch_object(row, runner.live_counts(batch_id)))
    if row["status"] not in _CANCELLABLE:
        raise APIError(409, f"Cannot cancel a batch with status {row['status']!r}.", code="batch_not_cancellable")
    fields = {"status": "cancelling", "cancelling_at": utcnow()}
    await asyncio.to_thread(batch_store(request.app).update_batch, batch_id, **fields)
    runner.cancel(batch_id)
    return dumps(batch_object({**row, **fields}, runner.live_counts(batch_id)))
