"""The FastAPI app: one router per room (OpenAI's routes, Responses, Messages, files, batches, admin,
operations), the error handlers and the OpenAPI document.

``create_app(settings, backends=None)`` builds it; the lifespan starts the
backends (in the background: ``/ready`` says when they are loaded) and engine
telemetry and, on shutdown, drains in-flight requests.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from tokenops import __version__
from tokenops.backends.base import Replica
from tokenops.config import Settings
from tokenops.gateway.admin.admin import router as admin_router
from tokenops.gateway.admin.distill_admin import router as distill_admin_router
from tokenops.gateway.admin.gateways_admin import start_registry, stop_registry
from tokenops.gateway.anthropic.messages_api import router as messages_router
from tokenops.gateway.batches import router as batches_router
from tokenops.gateway.batches.batch_state import batch_runner
from tokenops.gateway.edge.guards import GuardMiddleware
from tokenops.gateway.edge.openapi_contract import allowed_methods, declare
from tokenops.gateway.edge.openapi_errors import add_error_responses
from tokenops.gateway.errors import APIError
from tokenops.gateway.files import router as files_router
from tokenops.gateway.observability.ops_routes import router as ops_router
from tokenops.gateway.openai.chat_routes import router as chat_router
from tokenops.gateway.openai.images import router as images_router
from tokenops.gateway.openai.model_routes import router as model_router
from tokenops.gateway.openai.schemas import ChatCompletionRequest, CompletionRequest
from tokenops.gateway.openai.tokenize_api import router as tokenize_router
from tokenops.gateway.responses.responses_api import router as responses_router
from tokenops.gateway.state import Gateway


def _group(backends: Any) -> dict[str, list[Replica]]:
    """Accept ``{model: [backend, ...]}`` or a list of backends (grouped by ``.model``)."""
    if isinstance(backends, dict):
        items = [(model, b) for model, bs in backends.items() for b in (bs if isinstance(bs, (list, tuple)) else [bs])]
    else:
        items = [(b.model, b) for b in backends]
    out: dict[str, list[Replica]] = {}
    for model, b in items:
        replicas = out.setdefault(model, [])
        replicas.append(
            b if isinstance(b, Replica) else Replica(name=b.name, model=model, backend=b, index=len(replicas))
        )
    return out


def create_app(
    settings: Settings | None = None,
    backends: Any = None,
    *,
    store: Any = None,
    admin_key_hash: str | None = None,
    allow_open: bool = False,
    drain_timeout_s: float = 30.0,
) -> FastAPI:
    """Build the gateway app.

    :param backends: None builds replicas from ``settings`` (``[[models]]`` or the demo
        model); else ``{model: [Backend, ...]}`` or a list of backends.
    :param store: an open :class:`tokenops.store.Store` for audits and named queries.
    :param admin_key_hash: SHA-256 hex of the admin key (else from settings, or a random one).
    :param allow_open: serve non-loopback clients even without API keys.
    """
    settings = settings or Settings()
    replicas = None if backends is None else _group(backends)
    gateway = Gateway(settings, replicas, store=store, admin_key_hash=admin_key_hash, allow_open=allow_open)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway.begin()  # models load in the background; /health answers meanwhile
        start_registry(app, gateway)  # this replica in the service's list (GET /admin/gateways)
        # unfinished batches resume once models load (shared state: batches of the other replicas too)
        if gateway.store is not None or gateway.settings.shared.postgres_url:
            with gateway.scope():  # its task runs with this gateway's plugins
                batch_runner(app).start()  # (without a store it starts with the first batch)
        try:
            yield
        finally:
            if getattr(app.state, "batch_runner", None) is not None:  # lines in flight are not written:
                await app.state.batch_runner.stop()  # they run again after a restart
            await gateway.drain(drain_timeout_s)
            await gateway.stop()
            stop_registry(app)

    app = FastAPI(
        title="tokenops",
        version=__version__,
        lifespan=lifespan,
        description="OpenAI-compatible gateway in front of the bundled engine and OpenAI-compatible servers.",
    )
    app.state.gateway = gateway
    app.add_middleware(GuardMiddleware, gateway=gateway)
    _install_error_handlers(app)
    app.include_router(chat_router)  # /v1/chat/completions, /v1/completions, /v1/models
    app.include_router(ops_router)  # /health, /ready, /metrics
    app.include_router(admin_router)
    app.include_router(model_router)  # /v1/embeddings, /v1/models/{id}
    app.include_router(images_router)  # /v1/images/generations
    app.include_router(distill_admin_router)  # /admin/distill/pairs
    app.include_router(responses_router)  # /v1/responses (OpenAI's Responses API)
    app.include_router(messages_router)  # /v1/messages, /v1/messages/count_tokens (Anthropic)
    app.include_router(tokenize_router)  # /tokenize, /detokenize (vLLM)
    app.include_router(files_router)  # /v1/files (Batch API input and output)
    app.include_router(batches_router)  # /v1/batches (OpenAI's Batch API)
    _install_openapi(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        err = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path"))
        return APIError(
            400,
            f"{loc}: {err.get('msg', 'invalid value')}" if loc else "invalid request",
            code="invalid_value",
            param=loc or None,
        ).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404:
            message = f"Unknown path {request.url.path}"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every route of the path, not only the first one's methods
            headers["Allow"] = ", ".join(allowed_methods(request.app, request.scope))
        return APIError(exc.status_code, message, code=None, headers=headers).response()

    # anything else: tokenops.gateway.edge.guards.GuardMiddleware answers a 500 without internals


def _install_openapi(app: FastAPI) -> None:
    """Put the request models' nested definitions where their ``$ref``s point."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = original()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (ChatCompletionRequest, CompletionRequest):
                full = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(full.pop("$defs", {}))
                components[model.__name__] = full
            app.openapi_schema = declare(add_error_responses(schema))  # what hand-read routes enforce
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
