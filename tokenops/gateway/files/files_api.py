"""OpenAI's Files API, for batch input and output: ``POST /v1/files`` (multipart, ``purpose =
"batch"``: the JSONL is checked line by line as it is stored, :mod:`tokenops.gateway.batches.batch_input`),
``GET /v1/files``, ``GET /v1/files/{id}``, ``DELETE /v1/files/{id}``, ``GET /v1/files/{id}/content``.
Per tenant: another tenant's file is a 404. An upload is bounded by ``[batches] max_file_bytes``
(413 while it arrives) and ``max_lines``; a tenant keeps at most ``max_files_per_tenant`` files.
An upload may expire (``expires_after[anchor]`` and ``expires_after[seconds]``, OpenAI's form
fields: :mod:`tokenops.gateway.batches.file_expiry`); any other form field is a 400 naming it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import IO, Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.datastructures import UploadFile
from starlette.responses import FileResponse, Response

from tokenops.gateway.batches.batch_input import check_file
from tokenops.gateway.batches.batch_state import batch_runner, batch_store, file_object
from tokenops.gateway.batches.file_expiry import (
    ANCHOR_FIELD,
    MAX_EXPIRES_S,
    MIN_EXPIRES_S,
    SECONDS_FIELD,
    upload_expiry,
)
from tokenops.gateway.batches.tenant_rows import dumps, error_response, list_page, not_found, tenant_of, tenant_row
from tokenops.gateway.errors import APIError
from tokenops.store.batch_store import new_id

router = APIRouter()
#: multipart headers and the purpose field, beside the file itself
_FORM_OVERHEAD_BYTES = 64 * 1024
_READ_RATE_BYTES_S = 1024 * 1024  # an upload may take body_timeout_s plus a second per MB
_FIELDS = ("file", "purpose", ANCHOR_FIELD, SECONDS_FIELD)


async def _form(request: Request, limit: int, timeout_s: float) -> Any:
    """The multipart form, refused with 413 once the body passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(
            413, f"The upload of {declared} bytes exceeds [batches] max_file_bytes.", code="request_too_large"
        )
    if not (request.headers.get("content-type") or "").lower().startswith("multipart/form-data"):
        raise APIError(
            415, "Upload the file as multipart/form-data with fields file and purpose.", code="unsupported_media_type"
        )
    size = 0
    receive = request.receive

    async def bounded() -> Any:
        nonlocal size
        message = await receive()
        size += len(message.get("body", b""))
        if size > limit:
            raise APIError(413, "The upload exceeds [batches] max_file_bytes.", code="request_too_large")
        return message

    bounded_request = Request(request.scope, bounded)
    budget = timeout_s + (int(declared) if declared and declared.isdigit() else limit) / _READ_RATE_BYTES_S
    try:
        return await asyncio.wait_for(bounded_request.form(max_files=1, max_fields=8), budget)
    except TimeoutError:
        raise APIError(408, f"The upload did not arrive within {budget:.0f} s.", code="request_timeout") from None
    except APIError:
        raise
    except Exception as e:  # malformed multipart (starlette's MultiPartException and the parser's errors)
        raise APIError(400, f"The multipart body cannot be read: {e}", code="invalid_multipart") from None


_UPLOAD = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": "JSONL, one request a line"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                        ANCHOR_FIELD: {"type": "string", "enum": ["created_at"]},
                        SECONDS_FIELD: {
                            "type": "integer",
                            "minimum": MIN_EXPIRES_S,
                            "maximum": MAX_EXPIRES_S,
                            "description": "the file expires this long after its created_at (with the anchor)",
                        },  # fmt: skip
                    },
                    "additionalProperties": False,
                    "dependentRequired": {ANCHOR_FIELD: [SECONDS_FIELD], SECONDS_FIELD: [ANCHOR_FIELD]},
                }
            }
        },
    }
}


@router.post(
    "/v1/files",
    tags=["files"],
    summary="Upload a JSONL file for the Batch API (multipart)",
    openapi_extra=_UPLOAD,
)
async def upload_file(request: Request) -> Response:
    gw, tenant, _ = tenant_of(request, is_write=True)
    settings = gw.settings.batches
    form = await _form(request, settings.max_file_bytes + _FORM_OVERHEAD_BYTES, gw.settings.gateway.body_timeout_s)
    try:
        _check_fields(form)
        expires_after_s = upload_expiry(form)
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise APIError(
                400, f'purpose: only "batch" is served here, got {purpose!r}', code="invalid_value", param="purpose"
            )
        if not isinstance(upload, UploadFile):
            raise APIError(
                400, "file: send the JSONL file as the multipart field `file`", code="invalid_value", param="file"
            )
        if upload.size is not None and upload.size > settings.max_file_bytes:
            raise APIError(
                413,
                f"file: {upload.size} bytes exceed [batches] max_file_bytes = {settings.max_file_bytes}",
                code="request_too_large",
                param="file",
            )
        store = batch_store(request.app)
        if await asyncio.to_thread(store.num_files, tenant) >= settings.max_files_per_tenant:
            raise APIError(
                400,
                f"This tenant holds [batches] max_files_per_tenant = {settings.max_files_per_tenant} files; delete some first.",
                code="too_many_files",
            )
        file_id = new_id("file-")
        row = await asyncio.to_thread(
            _store_checked, gw, store, file_id, tenant, upload.file, upload.filename, expires_after_s
        )
    finally:
        await form.close()
    if expires_after_s is not None:
        batch_runner(request.app).start()  # its loop sweeps expired files (started already with a store)
    return dumps(file_object(row))


def _check_fields(form: Any) -> None:
    """Every form field is one this route acts on, given once: else the 400 naming it."""
    seen: set[str] = set()
    for name, _ in form.multi_items():
        if name not in _FIELDS:
            shown = name[:200]
            hint = f" (send {ANCHOR_FIELD} and {SECONDS_FIELD})" if name.startswith("expires_after") else ""
            raise APIError(
                400, f"{shown}: unknown form field; this route takes {', '.join(_FIELDS)}{hint}",
                code="invalid_value", param=shown,
            )  # fmt: skip
        if name in seen:
            raise APIError(400, f"{name}: the form field is given more than once", code="invalid_value", param=name)
        seen.add(name)


def _store_checked(
    gw: Any,
    store: Any,
    file_id: str,
    tenant: str,
    stream: IO[bytes],
    filename: str | None,
    expires_after_s: int | None = None,
) -> dict[str, Any]:
    """Check and copy the upload to its place; only a file that passed is kept (and recorded)."""
    final = store.path(file_id)
    part = final.with_suffix(".part")
    try:
        with open(part, "wb") as out:
            num_lines = check_file(gw, stream, out, gw.settings.batches.max_lines)
            out.flush()
            os.fsync(out.fileno())
        os.replace(part, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
    return store.add_file(file_id, tenant, "batch", filename, num_lines, expires_after_s=expires_after_s)


@router.get("/v1/files", tags=["files"], summary="This tenant's files")
async def list_files(
    request: Request,
    purpose: str | None = Query(None, max_length=64),
    after: str | None = Query(None, max_length=200),
    limit: int = Query(10000, ge=1, le=10000),
    order: Literal["asc", "desc"] = Query("desc"),
) -> Response:
    _, tenant, _ = tenant_of(request)
    rows = await asyncio.to_thread(batch_store(request.app).files, tenant, purpose, after, limit + 1, order == "desc")
    return list_page([file_object(r) for r in rows[:limit]], len(rows) > limit)


@router.get("/v1/files/{file_id}", tags=["files"], summary="A file of this tenant")
async def retrieve_file(request: Request, file_id: str) -> Response:
    _, row = await tenant_row(request, "file", file_id)
    return dumps(file_object(row))


@router.delete(
    "/v1/files/{file_id}",
    tags=["files"],
    summary="Delete a file (not the input of a running batch)",
    openapi_extra={"responses": {"409": error_response("The file is the input of a batch that has not finished")}},
)
async def delete_file(request: Request, file_id: str) -> Response:
    tenant, _ = await tenant_row(request, "file", file_id)
    store = batch_store(request.app)
    users = [b["id"] for b in await asyncio.to_thread(store.active_batches) if b["input_file_id"] == file_id]
    if users:
        raise APIError(
            409,
            f"The file is the input of batch {users[0]}, which has not finished; cancel it first.",
            code="file_in_use",
        )
    await asyncio.to_thread(store.delete_file, tenant, file_id)
    return dumps({"id": file_id, "object": "file", "deleted": True})


@router.get(
    "/v1/files/{file_id}/content",
    tags=["files"],
    summary="The bytes of a file of this tenant",
    response_class=FileResponse,
    openapi_extra={
        "responses": {
            "200": {"description": "The file", "content": {"application/jsonl": {"schema": {"type": "string"}}}}
        }
    },
)
async def file_content(request: Request, file_id: str) -> Response:
    _, row = await tenant_row(request, "file", file_id)
    path = await asyncio.to_thread(batch_store(request.app).path, file_id)  # fetched when another replica wrote it
    if not path.exists():
        raise not_found("file", file_id)
    return FileResponse(path, media_type="application/jsonl", filename=row["filename"] or f"{file_id}.jsonl")
