"""The intake: what every API route does with a request before its own parsing.

One function, :func:`caller`, refuses new work while the server drains (503), authenticates the
key (a tenant, or a 401) and keeps the request's headers without credentials; :func:`read_caller_body`
reads the body within its size and time limits (413/408); :func:`stamp` gives the internal request
its tenant, key, headers and session. Chat and completions, Responses, Messages, images, embeddings,
``/tokenize``, models, files and batches all enter here, so the rules are written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from tokenops.gateway.edge.body import read_body
from tokenops.gateway.errors import APIError
from tokenops.types import GatewayRequest

#: Credentials never travel further than authentication (plugins and backends see the other headers).
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "x-admin-key", "cookie"})


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the running gateway, the key's tenant and id, the headers without credentials."""

    gateway: Any  # tokenops.gateway.state.Gateway (not imported: state imports the routes' helpers)
    tenant: str
    key_id: str | None
    headers: dict[str, str] = field(default_factory=dict)


def caller(request: Request, *, is_write: bool = True) -> Caller:
    """The caller of ``request``: a 503 while draining (for requests that start work), a 401 without a valid key."""
    gw = request.app.state.gateway
    if is_write and gw.is_draining:
        raise APIError(503, "The server is shutting down.", code="shutting_down")
    client = request.client.host if request.client else None
    tenant, key_id = gw.api_keys.tenant_for(request.headers, client)
    headers = {k: v for k, v in request.headers.items() if k not in SECRET_HEADERS}
    return Caller(gw, tenant, key_id, headers)


async def read_caller_body(request: Request, who: Caller) -> bytes:
    """The raw body, within ``[gateway] max_body_bytes`` and ``body_timeout_s``."""
    conf = who.gateway.settings.gateway
    return await read_body(request, conf.max_body_bytes, conf.body_timeout_s)


def stamp(greq: GatewayRequest, who: Caller) -> GatewayRequest:
    """Give the internal request its tenant, key id, headers and session (``x-session-id`` wins).

    On an open server (no API keys) a request's session, when it names one, is its tenant."""
    greq.tenant = greq.session_id if (who.gateway.api_keys.is_open and greq.session_id) else who.tenant
    greq.api_key_id = who.key_id
    greq.headers = dict(who.headers)
    greq.session_id = greq.headers.get("x-session-id") or greq.session_id
    return greq
