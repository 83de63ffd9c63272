"""ASGI guards around the whole app: browsers on loopback, and the last word on errors.

:class:`GuardMiddleware` runs before routing:

- A keyless server (no ``[gateway] api_keys``, no ``--allow-open``) is reachable
  from any web page its user opens. A cross-site ``<form>`` POST needs no CORS
  preflight when its content type is ``text/plain`` or a form encoding, and DNS
  rebinding lets a page read answers under a name it controls. So such a server
  answers only ``Host`` names in ``[gateway] allowed_hosts`` (or loopback IP
  literals), 421 otherwise, and reads request bodies only when they are
  ``application/json`` (415 otherwise). With API keys, every request carries a
  secret a page cannot know, and none of this applies.
- An exception no handler claimed becomes a 500 OpenAI error with an error id
  (the traceback goes to the log under the same id), sent as a normal response,
  so the keep-alive connection stays usable. Starlette's own last-resort handler
  re-raises after answering, which makes the server drop the connection.

Under ``/v1/messages`` these answers are in Anthropic's error shape, as every other
answer of the Messages API is.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import secrets
from collections.abc import Callable
from typing import Any

from tokenops.gateway.errors import APIError

log = logging.getLogger("tokenops.gateway")

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def host_name(value: str) -> str:
    """The name part of a ``Host`` header: ``[::1]:8000`` -> ``::1``, ``Example:80`` -> ``example``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


@functools.lru_cache(maxsize=1024)
def _is_loopback_literal(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_allowed_host(value: str | None, allowed: frozenset[str]) -> bool:
    if value is None:  # HTTP/1.0 without Host: no browser sends that
        return True
    name = host_name(value)
    return name in allowed or _is_loopback_literal(name)


def is_json_content_type(value: str | None) -> bool:
    if not value:
        return False
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class GuardMiddleware:
    """Pure ASGI middleware (no body buffering): see the module docstring."""

    def __init__(self, app: Callable, gateway: Any) -> None:
        self.app = app
        self.gateway = gateway
        self.allowed_hosts = frozenset(host_name(h) for h in gateway.settings.gateway.allowed_hosts)

    def _is_guarded(self) -> bool:
        keys = self.gateway.api_keys
        return keys.is_open and not keys.allow_open

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        with self.gateway.scope():  # this gateway's plugins, budgets and tracer, for this request only
            await self._serve(scope, receive, send)

    async def _serve(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._is_guarded():
            refusal = self._refusal(scope)
            if refusal is not None:
                await _error_response(scope, refusal)(scope, receive, send)
                return
        response_started = False

        async def tracking_send(message: dict) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as e:
            if response_started:
                raise  # the status line is gone: the server closes the connection, the only honest signal left
            error_id = secrets.token_hex(6)
            log.error("internal error %s on %s %s", error_id, scope.get("method"), scope.get("path"), exc_info=e)
            err = APIError(
                500,
                f"The server had an error while processing your request (error id {error_id}); "
                "retry, and report the id if it persists.",
                code="internal_error",
            )
            await _error_response(scope, err)(scope, receive, send)

    def _refusal(self, scope: dict) -> APIError | None:
        headers = _headers(scope)
        host = headers.get("host")
        if not is_allowed_host(host, self.allowed_hosts):
            return APIError(
                421,
                f"Host {host!r} is not served: a server without API keys answers only the names in "
                "[gateway] allowed_hosts (default localhost, 127.0.0.1, ::1); add it there, or configure "
                "API keys.",
                code="host_not_allowed",
                type="invalid_request_error",
            )
        if (
            scope.get("method") in _BODY_METHODS
            and not is_json_content_type(headers.get("content-type"))
            and not _is_credentialed_upload(scope, headers)
            and _is_routed(scope)
        ):  # an undeclared method or path gets its 405 / 404 from routing
            return APIError(
                415,
                f"Content-Type {headers.get('content-type') or '(none)'!r} is not accepted: send the "
                "body as JSON with 'Content-Type: application/json'.",
                code="unsupported_media_type",
                type="invalid_request_error",
            )
        return None


def _is_credentialed_upload(scope: dict, headers: dict[str, str]) -> bool:
    """A file upload (``POST /v1/files``, multipart) that carries an ``Authorization`` or ``X-Api-Key``
    header: a cross-site form cannot send either without a CORS preflight (the openai SDK always does)."""
    content_type = (headers.get("content-type") or "").lower()
    return (
        scope.get("path") == "/v1/files"
        and content_type.startswith("multipart/form-data")
        and bool(headers.get("authorization") or headers.get("x-api-key"))
    )


def _is_routed(scope: dict) -> bool:
    """The method is one the path takes (asked only of a body with the wrong type): the OpenAPI
    document's methods of the path, as a 405's ``Allow`` lists them. Hidden catch-alls that only
    answer a 405 (the Messages API's) leave the answer to them: a PUT there is a 405, not a 415."""
    from tokenops.gateway.edge.openapi_contract import allowed_methods

    app = scope.get("app")
    if getattr(app, "router", None) is None:
        return True
    return scope.get("method") in allowed_methods(app, scope)


def _error_response(scope: dict, err: APIError) -> Callable:
    """``err`` as an ASGI response: Anthropic's shape under ``/v1/messages``, OpenAI's elsewhere."""
    path = scope.get("path", "")
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        from tokenops.gateway.anthropic.messages_api import anthropic_error

        return anthropic_error(err)
    return err.response()


def _headers(scope: dict) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope.get("headers") or ():
        key = name.decode("latin-1")
        if key in ("host", "content-type", "authorization", "x-api-key") and key not in out:
            out[key] = value.decode("latin-1")
    return out
