"""Admin API for session memory (admin key required), mounted under ``/admin``.

- ``GET /admin/memory/sessions`` (``?tenant=``): sessions with entry counts and bytes.
- ``GET /admin/memory/sessions/{tenant}/{session}``: one session's entries.
- ``DELETE /admin/memory/sessions/{tenant}/{session}``: forget one session.
- ``DELETE /admin/memory/tenants/{tenant}``: forget every session of a tenant (call it
  when a tenant is removed).

404 ``memory_disabled`` when the session_memory plugin is off.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.gateway.errors import APIError
from tokenops.memory.memory_store import get_session_memory

router = APIRouter(tags=["admin"])


def _memory(request: Request) -> Any:
    request.app.state.gateway.admin.check(request.headers)
    memory = get_session_memory()
    if memory is None:
        raise APIError(
            404,
            "Session memory is off; enable it with [plugins.session_memory] enabled = true.",
            code="memory_disabled",
        )
    return memory


def _json(data: Any) -> Response:
    return Response(json.dumps(data), media_type="application/json")


@router.get("/memory/sessions", summary="Sessions held by session memory (per tenant)")
async def list_sessions(request: Request, tenant: str | None = None) -> Response:
    memory = _memory(request)
    return _json({"sessions": memory.sessions(tenant), "stats": memory.stats()})


@router.get("/memory/sessions/{tenant}/{session}", summary="One session's stored entries")
async def get_session(request: Request, tenant: str, session: str) -> Response:
    entries = _memory(request).entries(tenant, session)
    if entries is None:
        raise APIError(404, f"No memory for session {session!r} of tenant {tenant!r}.", code="session_not_found")
    return _json({"tenant": tenant, "session": session, "entries": entries})


@router.delete("/memory/sessions/{tenant}/{session}", summary="Forget one session")
async def delete_session(request: Request, tenant: str, session: str) -> Response:
    return _json(
        {"tenant": tenant, "session": session, "deleted_entries": _memory(request).delete_session(tenant, session)}
    )


@router.delete("/memory/tenants/{tenant}", summary="Forget every session of a tenant")
async def delete_tenant(request: Request, tenant: str) -> Response:
    return _json({"tenant": tenant, "deleted_entries": _memory(request).delete_tenant(tenant)})
