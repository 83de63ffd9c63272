"""OpenAI's Responses API: ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items``.

A thin layer: the body is translated into the gateway's one chat request
(:mod:`tokenops.gateway.responses.responses_request`), which runs through the same pipeline as
``/v1/chat/completions`` (keys, admission, budgets, routing, caching, telemetry: the
``requests`` row says ``"api": "responses"`` in its decisions); the answer is written
back as a Response (:mod:`tokenops.gateway.responses.responses_output`) or as typed events
(:mod:`tokenops.gateway.responses.responses_stream`). With ``store`` (the default) the Response
and the conversation it answered are kept per tenant
behind the shared-state seam (:mod:`tokenops.shared_state`): in the server's store, in memory
with ``--no-store``, or in PostgreSQL for every replica with ``[shared] postgres_url``;
``previous_response_id`` reads them back, for this tenant only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.gateway.core.decision_headers import decision_values
from tokenops.gateway.edge.abandon import unless_abandoned
from tokenops.gateway.edge.body import build_off_loop, checked_body
from tokenops.gateway.edge.body_counts import check_count, parsed_count
from tokenops.gateway.edge.event_stream import EventStream
from tokenops.gateway.errors import APIError
from tokenops.gateway.intake import caller, read_caller_body, stamp
from tokenops.gateway.responses.responses_chain import (
    check_stored_bytes,
    is_translated,
    limits,
    not_stored_event,
    stored_items,
)
from tokenops.gateway.responses.responses_chat import chat_body, deferred_error
from tokenops.gateway.responses.responses_output import ResponseFrame
from tokenops.gateway.responses.responses_request import ResponsesRequest, Translation, input_items, parse
from tokenops.gateway.responses.responses_stream import EventWriter
from tokenops.shared_state import ResponseStore, open_response_store
from tokenops.store.stored_responses import ChainHead, StoredResponse
from tokenops.types import GatewayRequest, NativeRequest

router = APIRouter()
log = logging.getLogger(__name__)
_JSON = "application/json"
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def response_store(app: Any) -> ResponseStore:
    """The app's stored responses, from the shared-state seam (its store, memory, or ``[shared]``)."""
    rs = getattr(app.state, "response_store", None)
    if rs is None:
        s = app.state.gateway.settings
        rs = app.state.response_store = open_response_store(
            s.shared, limits(s.gateway, s.store), app.state.gateway.store
        )
    return rs


def purge_tenant(app: Any, tenant: str) -> dict[str, int]:
    """``DELETE /admin/tenants/{name}``: the tenant's stored responses go with it."""
    return {"stored_responses": response_store(app).purge_tenant(tenant)}


def _not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", code="response_not_found", param=param)


async def _stored(request: Request, tenant: str, response_id: str) -> StoredResponse:
    found = await asyncio.to_thread(response_store(request.app).get, tenant, response_id)
    if found is None:
        raise _not_found(response_id)
    return found


async def _previous(store: ResponseStore, tenant: str, response_id: str) -> ChainHead:
    found = await asyncio.to_thread(store.head, tenant, response_id)
    if found is None:
        raise APIError(
            404,
            f"Previous response with id '{response_id}' not found.",
            code="previous_response_not_found",
            param="previous_response_id",
        )
    return found


def _replica_kinds(gw: Any, model: Any) -> list[tuple[str | None, Any]]:
    replicas = gw.replicas.get(model) if isinstance(model, str) else None
    return [(getattr(r.backend, "kind", None), getattr(r.backend, "serves_responses", None)) for r in replicas or ()]


def _is_reasoning(gw: Any, model: str) -> bool | None:
    """Whether ``model`` thinks: known for bundled models (a ``reasoning_parser``), else None."""
    replicas = gw.replicas.get(model) or ()
    if not replicas or any(getattr(r.backend, "kind", None) != "local" for r in replicas):
        return None
    return getattr(replicas[0].backend, "reasoning_parser", None) is not None


def _build(
    gw: Any, data: dict[str, Any], history: list[dict[str, Any]], default_max_tokens: int
) -> tuple[ResponsesRequest, GatewayRequest, list[dict[str, Any]], Translation]:
    req = parse(data)
    items = history + input_items(req)
    tr = Translation(offset=len(history))
    tr.is_reasoning_model = _is_reasoning(gw, req.model)
    body = chat_body(req, items, tr, default_max_tokens)
    kinds = _replica_kinds(gw, req.model)
    tr.stored = stored_items(items[len(history) :], is_translated(kinds))  # this turn's own items, as kept
    is_upstream = bool(kinds) and all(kind == "openai" for kind, _ in kinds)
    # what only the Responses API carries is a 400 now, unless the model's upstreams may take the body as sent
    if tr.untranslatable and not (is_upstream and all(serves is not False for _, serves in kinds)):
        raise next(iter(tr.untranslatable.values()))
    if tr.text_only and not is_upstream:  # the bundled engine reads text only
        raise next(iter(tr.text_only.values()))
    if tr.untranslatable:  # the chat body does not hold the whole request: a cache keyed on it must not answer it
        body["cache"] = False
    greq = GatewayRequest(
        kind="chat",
        model=req.model,
        body=body,
        messages=body["messages"],
        stream=req.stream,
        max_tokens=req.max_output_tokens or default_max_tokens,
        session_id=req.user,
    )
    greq.native = NativeRequest(
        api="responses",
        path="/responses",
        body=_native(data, items),
        untranslatable=[(param, e.message) for param, e in tr.untranslatable.items()],
    )
    greq.decide("api", "responses")
    return req, greq, items, tr


def _native(data: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """The body an upstream serving ``/v1/responses`` gets: the whole conversation as
    ``input``, nothing for it to store or look up."""
    body = {k: v for k, v in data.items() if k not in ("previous_response_id", "store", "stream")}
    body["input"] = items
    body["store"] = False
    return body


def _openapi_body() -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ResponsesRequest.model_json_schema()}},
        }
    }


@router.post(
    "/v1/responses",
    tags=["openai"],
    summary="Create a model response (OpenAI Responses API; SSE when stream)",
    openapi_extra=_openapi_body(),
)
async def create_response(request: Request) -> Response:
    who = caller(request)
    gw, tenant, conf = who.gateway, who.tenant, who.gateway.settings.gateway
    raw = await read_caller_body(request, who)
    data = await build_off_loop(raw, lambda b: checked_body(b, conf, "input"))
    store = response_store(request.app)
    previous, head = data.get("previous_response_id"), None
    history: list[dict[str, Any]] = []
    if isinstance(previous, str) and previous:
        head = await _previous(store, tenant, previous)  # the bounds first, from its row alone
        check_count(parsed_count(data, "input"), conf.max_messages, "input", head.num_chain_items)
        history = await asyncio.to_thread(store.conversation, tenant, previous)
    req, greq, items, tr = await build_off_loop(raw, lambda _: _build(gw, data, history, conf.default_max_tokens))
    stamp(greq, who)
    if req.store:  # measured off the loop: a 4 MB input is serialized once to count its bytes
        frame = ResponseFrame(req, req.model)
        await build_off_loop(
            raw, lambda _: check_stored_bytes(store.limits, head, tr.stored, frame.body("in_progress", []))
        )
    items = history + tr.stored  # what is kept: save() writes this turn's own items, linked to the chain
    try:
        if greq.stream:
            return await _stream(gw, store, req, greq, items, tr)
        answer, rec = await unless_abandoned(request.receive, gw.pipeline.respond(greq))  # a client that leaves cancels
    except APIError as e:
        raise deferred_error(e, tr) from None
    frame = ResponseFrame(req, rec.model_served or req.model)
    body = frame.finished(answer)
    if req.store and not await _save(store, greq.tenant, body, items, req.previous_response_id, tr.offset):
        body["store"] = False
    return Response(_dumps(body), media_type=_JSON, headers=greq.response_headers or None)


async def _stream(
    gw: Any,
    store: ResponseStore,
    req: ResponsesRequest,
    greq: GatewayRequest,
    items: list[dict[str, Any]],
    tr: Translation,
) -> Response:
    deltas, rec = await gw.pipeline.open_stream(greq)
    writer = EventWriter(ResponseFrame(req, rec.model_served or req.model))

    async def body() -> AsyncIterator[bytes]:
        usage = None
        for event in writer.start():
            yield event
        async with contextlib.aclosing(deltas):
            try:
                async for d in deltas:
                    if d.is_usage:
                        usage = d
                        continue
                    for event in writer.push(d):
                        yield event
            except APIError as e:
                e = deferred_error(e, tr)
                for event in writer.failed(e.code, e.message):
                    yield event
                return
        completion = usage.completion_tokens if usage and usage.completion_tokens is not None else rec.tokens_out
        events, final = writer.finish(
            usage.prompt_tokens if usage else rec.tokens_in,
            completion or 0,
            (usage.cached_tokens if usage else rec.tokens_cached) or 0,
            usage.reasoning_tokens if usage else rec.reasoning_tokens,
            decision_values(rec) if gw.pipeline.decision_headers else None,
        )
        # before the last event: the client's next turn finds it
        if req.store and not await _save(store, greq.tenant, final, items, req.previous_response_id, tr.offset):
            events[-1] = not_stored_event(events[-1])
        for event in events:
            yield event

    return EventStream(
        body(),
        deltas,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **greq.response_headers},
    )


async def _save(
    store: ResponseStore,
    tenant: str,
    body: dict[str, Any],
    items: list[dict[str, Any]],
    previous_response_id: str | None,
    num_history: int,
) -> bool:
    is_saved = await asyncio.to_thread(store.save, tenant, body, items, previous_response_id, num_history)
    if not is_saved:
        log.warning("response %s not kept: its answer passes a stored-bytes bound of [gateway]", body["id"])
    return is_saved


@router.get("/v1/responses/{response_id}", tags=["openai"], summary="A stored response (this tenant's)")
async def retrieve_response(request: Request, response_id: str) -> Response:
    tenant = caller(request, is_write=False).tenant
    found = await asyncio.to_thread(response_store(request.app).response, tenant, response_id)
    if found is None:
        raise _not_found(response_id)
    return Response(_dumps(found), media_type=_JSON)


@router.delete("/v1/responses/{response_id}", tags=["openai"], summary="Delete a stored response (this tenant's)")
async def delete_response(request: Request, response_id: str) -> Response:
    tenant = caller(request, is_write=False).tenant
    if not await asyncio.to_thread(response_store(request.app).delete, tenant, response_id):
        raise _not_found(response_id)
    return Response(_dumps({"id": response_id, "object": "response", "deleted": True}), media_type=_JSON)


@router.get(
    "/v1/responses/{response_id}/input_items",
    tags=["openai"],
    summary="The conversation a stored response answered (earlier turns included)",
)
async def list_input_items(request: Request, response_id: str) -> Response:
    tenant = caller(request, is_write=False).tenant
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, "order must be asc or desc", code="invalid_value", param="order")
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise APIError(400, "limit must be an integer from 1 to 100", code="invalid_value", param="limit")
    found = await _stored(request, tenant, response_id)
    items = found.input_items if order == "asc" else list(reversed(found.input_items))
    if after := q.get("after"):
        ids = [i.get("id") for i in items]
        if after not in ids:
            raise APIError(400, f"after: no input item {after!r} in this response", code="invalid_value", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return Response(
        _dumps(
            {
                "object": "list",
                "data": page,
                "first_id": page[0].get("id") if page else None,
                "last_id": page[-1].get("id") if page else None,
                "has_more": len(items) > limit,
            }
        ),
        media_type=_JSON,
    )
