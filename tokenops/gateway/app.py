"""The FastAPI app: OpenAI-compatible ``/v1`` endpoints, health, ``/metrics`` and the admin API.

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
from tokenops.gateway.abandon import unless_abandoned
from tokenops.gateway.admin import router as admin_router
from tokenops.gateway.batches import router as batches_router
from tokenops.gateway.batches.batch_state import batch_runner
from tokenops.gateway.body import build_off_loop, checked_body, read_body
from tokenops.gateway.decision_headers import decision_values
from tokenops.gateway.distill_admin import router as distill_admin_router
from tokenops.gateway.errors import APIError, sse_error
from tokenops.gateway.event_stream import EventStream
from tokenops.gateway.files import router as files_router
from tokenops.gateway.guards import GuardMiddleware
from tokenops.gateway.images import router as images_router
from tokenops.gateway.messages_api import router as messages_router
from tokenops.gateway.model_routes import model_cards, readiness
from tokenops.gateway.model_routes import router as model_router
from tokenops.gateway.openai_format import DONE, ChunkWriter, response_body
from tokenops.gateway.openapi_contract import allowed_methods, declare
from tokenops.gateway.openapi_errors import add_error_responses
from tokenops.gateway.prompt_fan_out import PromptFanOut
from tokenops.gateway.replica_health import prometheus_text as breaker_metrics
from tokenops.gateway.replica_health import replica_states
from tokenops.gateway.responses_api import router as responses_router
from tokenops.gateway.schemas import ChatCompletionRequest, CompletionRequest, chat_request, completion_requests
from tokenops.gateway.state import Gateway
from tokenops.gateway.tokenize_api import router as tokenize_router
from tokenops.types import GatewayRequest

_JSON = "application/json"
#: Credentials never travel further than authentication (plugins see the other headers).
_SECRET_HEADERS = ("authorization", "x-api-key", "x-admin-key", "cookie")


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
        if gateway.store is not None:  # batches left unfinished by the last run resume once models load
            batch_runner(app).start()  # (without a store it starts with the first batch)
        try:
            yield
        finally:
            if getattr(app.state, "batch_runner", None) is not None:  # lines in flight are not written:
                await app.state.batch_runner.stop()  # they run again after a restart
            await gateway.drain(drain_timeout_s)
            await gateway.stop()

    app = FastAPI(
        title="tokenops",
        version=__version__,
        lifespan=lifespan,
        description="OpenAI-compatible gateway in front of the bundled engine and OpenAI-compatible servers.",
    )
    app.state.gateway = gateway
    app.add_middleware(GuardMiddleware, gateway=gateway)
    _install_error_handlers(app)
    _install_openai_routes(app)
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

    # anything else: tokenops.gateway.guards.GuardMiddleware answers a 500 without internals


async def _handle(request: Request, build) -> Response:
    gw: Gateway = request.app.state.gateway
    if gw.is_draining:
        raise APIError(503, "The server is shutting down.", code="shutting_down")
    client = request.client.host if request.client else None
    tenant, key_id = gw.api_keys.tenant_for(request.headers, client)
    conf = gw.settings.gateway
    raw = await read_body(request, conf.max_body_bytes, conf.body_timeout_s)
    # large bodies are parsed and validated in a worker thread (the event loop keeps serving)
    built = await build_off_loop(raw, lambda b: build(checked_body(b, conf), conf.default_max_tokens))
    greqs: list[GatewayRequest] = built if isinstance(built, list) else [built]  # a list: completions' prompts
    for greq in greqs:
        greq.tenant = greq.session_id if (gw.api_keys.is_open and greq.session_id) else tenant
        greq.api_key_id = key_id
        greq.headers = {k: v for k, v in request.headers.items() if k not in _SECRET_HEADERS}
        greq.session_id = greq.headers.get("x-session-id") or greq.session_id
    greq = greqs[0]
    runner = gw.pipeline if len(greqs) == 1 else PromptFanOut(gw.pipeline, greqs)
    if greq.stream:
        return await _stream(gw, greq, request.receive, runner)
    # a client that leaves cancels its request (the engine aborts it): tokenops/gateway/abandon.py
    response, rec = await unless_abandoned(request.receive, runner.respond(greq))
    return Response(
        response_body(greq, response, rec.model_served or greq.model),
        media_type=_JSON,
        headers=greq.response_headers or None,
    )


async def _stream(gw: Gateway, greq: GatewayRequest, receive: Any, runner: Any) -> Response:
    # up to the first delta (a wait for a slot, the prefill) nothing is written: watched like a whole answer
    deltas, rec = await unless_abandoned(receive, runner.open_stream(greq))
    writer = ChunkWriter(greq, rec.model_served or greq.model)

    async def body() -> AsyncIterator[bytes]:
        started: set[int] = set()
        usage = None
        # without a usage chunk, the last finish chunk carries the decisions: it is held until the end
        hold = gw.pipeline.decision_headers and not writer.include_usage
        held: tuple[int, str] | None = None
        async with contextlib.aclosing(deltas):
            try:
                async for d in deltas:
                    if held is not None and not d.is_usage:
                        yield writer.finish(*held)
                        held = None
                    if d.is_usage:
                        usage = d
                        continue
                    if writer.is_chat and d.index not in started:
                        started.add(d.index)
                        yield writer.role(d.index)
                    if d.extra and writer.is_chat:  # e.g. reasoning_content: before the content, as sent
                        yield writer.other(d.index, d.extra)
                    if d.text or d.logprobs:
                        yield writer.content(d.index, d.text, d.logprobs)
                    if d.refusal and writer.is_chat:
                        yield writer.refusal(d.index, d.refusal)
                    if d.tool_calls and writer.is_chat:
                        yield writer.tool_calls(d.index, d.tool_calls)
                    if d.finish_reason and hold:
                        held = (d.index, d.finish_reason)
                    elif d.finish_reason:
                        yield writer.finish(d.index, d.finish_reason)
            except APIError as e:
                if held is not None:
                    yield writer.finish(*held)
                yield sse_error(e)
                yield DONE
                return
        final = decision_values(rec) if gw.pipeline.decision_headers else None
        if writer.include_usage:
            prompt = usage.prompt_tokens if usage else rec.tokens_in
            completion = usage.completion_tokens if usage and usage.completion_tokens is not None else rec.tokens_out
            yield writer.usage(
                prompt or 0,
                completion or 0,
                (usage.cached_tokens if usage else rec.tokens_cached) or 0,
                usage.reasoning_tokens if usage else rec.reasoning_tokens,
                final,
            )
        elif held is not None:
            yield writer.finish(*held, final)
        yield DONE

    return EventStream(
        body(),
        deltas,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **greq.response_headers},
    )


def _install_openai_routes(app: FastAPI) -> None:
    from tokenops.gateway.schemas import openapi_body

    @app.post(
        "/v1/chat/completions",
        tags=["openai"],
        openapi_extra=openapi_body(ChatCompletionRequest),
        summary="Create a chat completion (SSE when stream is true)",
    )
    async def chat_completions(request: Request) -> Response:
        return await _handle(request, chat_request)

    @app.post(
        "/v1/completions",
        tags=["openai"],
        openapi_extra=openapi_body(CompletionRequest),
        summary="Create a text completion (SSE when stream is true)",
    )
    async def completions(request: Request) -> Response:
        limit = request.app.state.gateway.settings.gateway.max_messages  # prompts of one body
        return await _handle(request, lambda data, default: completion_requests(data, default, limit))

    @app.get("/v1/models", tags=["openai"], summary="Models this server serves")
    async def list_models(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        client = request.client.host if request.client else None
        gw.api_keys.tenant_for(request.headers, client)
        return Response(json.dumps({"object": "list", "data": list(model_cards(gw))}), media_type=_JSON)

    @app.get("/health", tags=["ops"], summary="Liveness")
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    @app.get("/ready", tags=["ops"], summary="Readiness: every backend loaded or failed, one serving")
    async def ready(request: Request) -> Response:
        status, body = readiness(request.app.state.gateway)  # a failed model is listed, not waited for
        return Response(json.dumps(body), status_code=status, media_type=_JSON)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics (vLLM names under tokenops:)")
    async def metrics(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        gw.metrics_auth.check(request.headers)  # the admin key or [gateway] metrics_key once keys exist
        per_model: dict[str, list[dict[str, Any]]] = {}
        stats = gw.engine_stats()
        for model, rs in gw.replicas.items():
            per_model[model] = [stats[r.name] for r in rs if r.name in stats]
        text = gw.prometheus.render({m: s for m, s in per_model.items() if s}, gw.replicas)
        text += breaker_metrics(replica_states(gw.replicas))
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


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
