"""Routes beside chat and completions: ``POST /v1/embeddings``, ``GET /v1/models/{id}``
(``client.models.retrieve``), and the readiness document of ``GET /ready``.

Readiness with a failed model: a model whose backend failed to start (an
architecture the engine cannot load, a missing folder) does not hold ``/ready``
at 503 forever. ``/ready`` is 200 once every model has either loaded or failed and
at least one serves; its body lists each failed model under ``failed`` (model ->
cause), each failed replica under ``failed_replicas`` (also those of a model that
still serves on its other replicas) and says ``"degraded": true``. It is 503 while
any model is still loading, when every model failed, and while draining. Requests
to a failed model get a 503 OpenAI error with code ``model_load_failed`` naming
the cause. An upstream (``backend = "openai"``) that cannot be reached counts as a failed
replica while it is down: listed under ``unreachable`` and ``failed_replicas``, not
serving (so a server whose only model is that upstream answers 503), and back as soon
as the upstream answers again (it is asked every 2 s).

``/v1/models`` lists the models that can answer: a model still loading is not listed (``/ready``
names it under ``loading``), nor is a failed one; ``GET /v1/models/{id}`` answers for every
configured model with its ``status`` (``ready``, ``loading`` or ``failed`` with its ``error``).
A model that loads on its first request (``engine = {load = "lazy"}``, or one beyond
``[gateway] max_loaded_models``) can answer: it is listed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.gateway.errors import APIError
from tokenops.gateway.intake import caller, read_caller_body, stamp

_JSON = "application/json"
router = APIRouter()


def load_error(replica: Any) -> str | None:
    """Why a replica's backend failed to start (set by ``Gateway.start``), else None."""
    return getattr(replica.backend, "load_error", None)


def failed_models(gw: Any) -> dict[str, str]:
    """Model -> the cause, for models none of whose replicas started."""
    out: dict[str, str] = {}
    for model, replicas in gw.replicas.items():
        errors = [e for e in (load_error(r) for r in replicas) if e]
        if replicas and len(errors) == len(replicas):
            out[model] = errors[0]
    return out


def readiness(gw: Any) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` of ``GET /ready`` (see the module docstring)."""
    # an upstream that cannot be reached is not serving, and not loading either: it is listed
    unreachable = {
        r.name: cause
        for rs in gw.replicas.values()
        for r in rs
        if isinstance(cause := getattr(r.backend, "unreachable", None), str)
    }
    states = {r.name: bool(r.ready) and r.name not in unreachable for rs in gw.replicas.values() for r in rs}
    errors = {r.name: load_error(r) or unreachable.get(r.name) for rs in gw.replicas.values() for r in rs}
    failed = failed_models(gw)
    is_loading = any(not ok and not errors[name] for name, ok in states.items())
    is_serving = any(states.values())
    is_ready = bool(states) and is_serving and not is_loading and not gw.is_draining
    body: dict[str, Any] = {"ready": is_ready, "replicas": states}
    loading = [model for model in gw.replicas if model_status(gw, model) == "loading"]
    if loading:
        body["loading"] = loading  # not in /v1/models yet
    if failed:
        body["failed"] = failed
    failed_replicas = {name: cause for name, cause in errors.items() if cause}
    if failed_replicas:
        body["failed_replicas"] = failed_replicas  # includes replicas of models that still serve on others
        body["degraded"] = True
    if unreachable:
        body["unreachable"] = unreachable
    return (200 if is_ready else 503), body


def model_failure(model: str, replicas: list[Any]) -> APIError | None:
    """The error for a request to ``model`` when all its replicas failed to start."""
    errors = [load_error(r) for r in replicas]
    if not replicas or not all(errors):
        return None
    return APIError(
        503,
        f"The model `{model}` failed to load and cannot serve: {errors[0]}",
        code="model_load_failed",
        param="model",
    )


def model_status(gw: Any, model: str) -> str:
    """``ready`` (it can answer now, or loads on its first request), ``loading`` or ``failed``."""
    replicas = gw.replicas.get(model, [])
    if any(r.ready for r in replicas):
        return "ready"
    return "failed" if model in failed_models(gw) else "loading"


def model_cards(gw: Any) -> Iterator[dict[str, Any]]:
    """The ``/v1/models`` cards of the models that can answer, in configuration order: a model
    still loading or failed is not listed (``GET /v1/models/{id}`` says which)."""
    for name, replicas in gw.replicas.items():
        if model_status(gw, name) == "ready":
            yield _card(gw, name, replicas)


def _card(gw: Any, name: str, replicas: list[Any]) -> dict[str, Any]:
    from tokenops.backends.registry import RANDOM_MODEL_NAME

    card: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": int(gw.started_at),
        "owned_by": "tokenops",
        "root": getattr(replicas[0].backend, "upstream_model", name) if replicas else name,
        "parent": getattr(replicas[0].backend, "parent", None) if replicas else None,
    }
    lens = [r.backend.max_model_len for r in replicas if getattr(r.backend, "max_model_len", None)]
    if lens:
        card["max_model_len"] = min(lens)
    card["backend"] = getattr(replicas[0].backend, "kind", None) if replicas else None
    tool_format = getattr(replicas[0].backend, "tool_format", None) if replicas else None
    if isinstance(tool_format, str):  # the bundled engine's: native | generic (backends/tool_format.py)
        card["tool_format"] = tool_format
        card["tool_call_parser"] = replicas[0].backend.tool_call_parser  # hermes, llama3_json, mistral, generic
    defaults = getattr(replicas[0].backend, "sampling_defaults", None) if replicas else None
    if defaults is not None:  # the bundled engine's, for unset fields (engine/sampling/sampling_defaults.py)
        card["sampling_defaults"] = defaults.as_dict()
    card["replicas"] = len(replicas)
    if name == RANDOM_MODEL_NAME:
        card["random_weights"] = True
        card["description"] = "random weights (demo model): the stack works offline; the text is gibberish"
    return card


def model_card(gw: Any, model_id: str) -> dict[str, Any] | None:
    """The card of any configured model, with its ``status`` (and the ``error`` of a failed one)."""
    if model_id not in gw.replicas:
        return None
    card = _card(gw, model_id, gw.replicas[model_id])
    card["status"] = model_status(gw, model_id)
    if card["status"] == "failed":
        card["error"] = failed_models(gw)[model_id]
    return card


@router.get("/v1/models/{model_id:path}", tags=["openai"], summary="One served model (404 when unknown)")
async def retrieve_model(model_id: str, request: Request) -> Response:
    gw = caller(request, is_write=False).gateway
    card = model_card(gw, model_id)
    if card is None:
        raise APIError(
            404,
            f"The model `{model_id}` does not exist. Available models: {', '.join(sorted(gw.replicas)) or 'none'}.",
            code="model_not_found",
            param="model",
        )
    return Response(json.dumps(card), media_type=_JSON)


def _embedding_body() -> dict[str, Any]:
    from tokenops.gateway.openai.embeddings import EmbeddingRequest

    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": EmbeddingRequest.model_json_schema()}},
        }
    }


@router.post(
    "/v1/embeddings", tags=["openai"], summary="Create embeddings (float or base64)", openapi_extra=_embedding_body()
)
async def create_embeddings(request: Request) -> Response:
    from tokenops.gateway.edge.body import build_off_loop, parse_json
    from tokenops.gateway.openai.embeddings import embed, embedding_request, response_bytes

    who = caller(request)
    raw = await read_caller_body(request, who)
    # 2,048 inputs of a 4 MB body take ~1 s to parse and validate: a worker thread does it
    greq = stamp(await build_off_loop(raw, lambda b: embedding_request(parse_json(b))), who)
    answer = await embed(who.gateway, greq)
    return Response(response_bytes(answer), media_type=_JSON, headers=getattr(greq, "response_headers", None) or None)
