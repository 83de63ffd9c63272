"""The first steps every API path takes before its own parsing: refuse while draining,
authenticate the key (a tenant, or a 401), read the body within its size and time
limits. ``/v1/chat/completions`` does the same in :func:`tokenops.gateway.app._handle`."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from tokenops.gateway.body import read_body
from tokenops.gateway.errors import APIError


async def authorized_body(request: Request) -> tuple[Any, tuple[str, str | None], bytes]:
    """The gateway, ``(tenant, key id)`` and the raw body (503/401/413/408 first)."""
    gw = request.app.state.gateway
    if gw.is_draining:
        raise APIError(503, "The server is shutting down.", code="shutting_down")
    client = request.client.host if request.client else None
    who = gw.api_keys.tenant_for(request.headers, client)
    conf = gw.settings.gateway
    return gw, who, await read_body(request, conf.max_body_bytes, conf.body_timeout_s)
