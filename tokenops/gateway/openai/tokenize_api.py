"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shapes, and the token count of
``/v1/messages/count_tokens``.

Bundled models answer from the engine's own tokenizer and chat template (tools
rendered as the engine renders them), so a count here is the count the engine
will see. ``openai`` upstreams get the request passed through (vLLM and SGLang
serve ``/tokenize``; a 404 from the upstream is passed on as one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, cast

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from tokenops.backends.base import Replica
from tokenops.backends.openai_http import OpenAIBackend
from tokenops.gateway.anthropic.messages_schema import chat_body
from tokenops.gateway.edge.body import build_off_loop, checked_body
from tokenops.gateway.errors import APIError, ModelNotFound, api_error
from tokenops.gateway.intake import caller, read_caller_body
from tokenops.gateway.openai.model_routes import model_failure
from tokenops.gateway.openai.schemas import ChatMessage, chat_request
from tokenops.types import BackendError, OutputFields

router = APIRouter()
_JSON = "application/json"


class TokenizeRequest(BaseModel):
    """vLLM's ``TokenizeCompletionRequest`` / ``TokenizeChatRequest`` (one of prompt, messages)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = Field(None, description="Default: true for a prompt, false for messages.")
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[int]


#: vLLM request fields the bundled engine does not implement, and why (a 400 names them).
_NOT_IMPLEMENTED = {
    "chat_template": "custom chat templates are not supported: the model's own template is used",
    "continue_final_message": "not implemented; false is accepted",
    "mm_processor_kwargs": "text-only models",
    "media_io_kwargs": "text-only models",
    "documents": "not implemented",
    "cache_salt": "not implemented",
}


def _parsed(model: type[BaseModel], data: dict[str, Any]) -> Any:
    for name, reason in _NOT_IMPLEMENTED.items():
        if data.get(name) not in (None, False):
            raise APIError(
                400,
                f"Unsupported parameter `{name}` for a bundled model: {reason}.",
                code="unsupported_parameter",
                param=name,
            )
    data = {k: v for k, v in data.items() if k not in _NOT_IMPLEMENTED}
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        msg = "unknown field (not part of vLLM's request)" if err.get("type") == "extra_forbidden" else err.get("msg")
        raise APIError(400, f"{loc}: {msg}", code="invalid_value", param=loc or None) from None


async def _passed_through(replica: Replica, path: str, data: dict[str, Any]) -> Response:
    """An upstream's answer to ``data`` as sent (it validates its own fields)."""
    status, answer = await _upstream(replica, path, data)
    if status >= 400:
        raise _upstream_error(replica, path, status, answer)
    return Response(json.dumps(answer), media_type=_JSON)


def default_model(gw: Any) -> str:
    """The model a request without ``model`` means (vLLM serves one, and lm-eval sends none): the
    first configured text model (bundled or upstream), which is the default model when none are configured."""
    for name, replicas in gw.replicas.items():
        if any(getattr(r.backend, "kind", None) in ("local", "openai") for r in replicas):
            return str(name)
    raise APIError(400, "model: required (this server serves no text model)", param="model")


def replica_for(gw: Any, model: str | None) -> Replica:
    """A ready replica of ``model`` (the default text model when None)."""
    if model is None:
        model = default_model(gw)
    if model not in gw.replicas:
        raise ModelNotFound(model, list(gw.replicas))
    ready = [r for r in gw.replicas[model] if r.ready]
    if not ready and (failure := model_failure(model, gw.replicas[model])) is not None:
        raise failure  # failed to load (at start or on demand): the cause, not "still loading"
    if not ready:
        raise APIError(
            503, f"The model `{model}` is not ready yet (still loading); retry shortly.", code="model_not_ready"
        )
    return ready[0]


def _tokenizer(replica: Replica) -> Any:
    backend = replica.backend
    tok = getattr(getattr(backend, "engine", None), "tokenizer", None) if backend.kind == "local" else None
    if tok is None:
        raise APIError(
            400,
            f"The model `{replica.model}` has no tokenizer here (a {backend.kind} backend).",
            code="unsupported_model",
            param="model",
        )
    return tok


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):  # text parts joined, as the bundled engine renders them
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return {**message, "content": content or ""}


def chat_token_ids(
    replica: Replica,
    body: dict[str, Any],
    *,
    add_generation_prompt: bool = True,
    add_special_tokens: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of a chat body (``messages``, ``tools``, ``tool_choice``) as the bundled engine renders it."""
    from tokenops.backends.local_structured import plan_request

    tok = _tokenizer(replica)
    taken = sorted({"messages", "add_generation_prompt"} & set(template_kwargs or {}))
    if taken:  # the template's own arguments (was a 500: "got multiple values for argument")
        raise APIError(
            400,
            f"chat_template_kwargs may not set {', '.join(taken)}: the request's own fields do",
            code="invalid_value",
            param="chat_template_kwargs",
        )
    plan = plan_request(OutputFields.from_body(body), getattr(replica.backend, "tool_call_parser", "hermes"))
    kwargs = {**plan.template_kwargs, **(template_kwargs or {})}
    try:
        text = tok.apply_chat_template(
            plan.prompt_messages([_plain(m) for m in body["messages"]]),
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except ValueError as e:  # the template raised (e.g. roles out of order)
        raise APIError(400, str(e), code="invalid_value", param="messages") from None
    return tok.encode(text, add_special_tokens=add_special_tokens)


async def _upstream(
    replica: Replica, path: str, body: dict[str, Any], headers: dict[str, str] | None = None, *, root: bool = True
) -> tuple[int, Any]:
    """POST ``body`` to an ``openai`` upstream (at its root, or under ``/v1``); ``(status, JSON)``."""
    backend = _upstream_backend(replica)
    try:
        r = await backend.send("POST", path, body, headers, root=root)
    except RuntimeError:
        raise APIError(503, f"The model `{replica.model}` is not ready yet.", code="model_not_ready") from None
    except Exception as e:  # noqa: BLE001 - any transport failure is the upstream's
        raise APIError(502, f"{backend.name}: cannot reach {path}: {type(e).__name__}", code="upstream_error") from None
    try:
        data = r.json()
    except ValueError:
        data = None
    return r.status_code, data


def _upstream_backend(replica: Replica) -> OpenAIBackend:
    """The ``openai`` backend of a replica the caller found to be one (``kind == "openai"``)."""
    return cast(OpenAIBackend, replica.backend)


def _upstream_error(replica: Replica, path: str, status: int, data: Any) -> APIError:
    err = data.get("error") if isinstance(data, dict) else None
    message = (err.get("message") if isinstance(err, dict) else err) or f"upstream answered {status}"
    if status == 404 and not isinstance(err, (dict, str)):
        message = f"the upstream of `{replica.model}` does not serve {path}"
    return APIError(status if 400 <= status < 600 else 502, str(message), code="upstream_error")


async def _auth_and_body(request: Request) -> tuple[Any, dict[str, Any]]:
    who = caller(request)
    gw, raw = who.gateway, await read_caller_body(request, who)
    data = await build_off_loop(raw, lambda b: checked_body(b, gw.settings.gateway))
    if data.get("model") is not None and not isinstance(data["model"], str):
        raise APIError(400, "model: must be a string", param="model")
    return gw, data


@router.post("/tokenize", tags=["vllm"], summary="Token ids of a prompt or chat (vLLM's shape)")
async def tokenize(request: Request) -> Response:
    gw, data = await _auth_and_body(request)
    replica = replica_for(gw, data.get("model"))
    if replica.backend.kind == "openai":
        return await _passed_through(replica, "/tokenize", data)
    # validated (messages, tool schemas: up to seconds of Python) in a worker thread
    req = await asyncio.to_thread(_tokenize_request, data)
    async with loaded(replica):
        answer = await _token_ids(replica, req)
    return Response(json.dumps(answer), media_type=_JSON)


def _tokenize_request(data: dict[str, Any]) -> TokenizeRequest:
    """The validated request: its fields, and its tools as a chat request's (the one schema budget)."""
    req: TokenizeRequest = _parsed(TokenizeRequest, data)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "send exactly one of `prompt` and `messages`", param="prompt")
    if req.tools is not None:
        from tokenops.gateway.openai.structured import check_structured

        # as a chat request's: a tool without "function" was a 500 (KeyError); schemas measured
        check_structured({"tools": req.tools})
    return req


@contextlib.asynccontextmanager
async def loaded(replica: Replica) -> AsyncIterator[None]:
    """The replica's engine kept resident meanwhile (loaded first under ``[gateway] max_loaded_models``)."""
    from tokenops.backends.model_swap import engine_held

    try:
        async with engine_held(replica.backend):
            yield
    except BackendError as e:  # its engine failed to load: the 503 a request to it gets
        raise api_error(e) from None


async def _token_ids(replica: Replica, req: TokenizeRequest) -> dict[str, Any]:
    if req.prompt is not None:
        tok = _tokenizer(replica)
        special = True if req.add_special_tokens is None else req.add_special_tokens
        ids = await asyncio.to_thread(tok.encode, req.prompt, special)
    else:
        body = {"messages": [m.model_dump(exclude_none=True) for m in req.messages or []]}
        if req.tools is not None:  # checked by _tokenize_request
            body["tools"] = req.tools
        ids = await asyncio.to_thread(
            lambda: chat_token_ids(
                replica,
                body,
                add_generation_prompt=req.add_generation_prompt,
                add_special_tokens=bool(req.add_special_tokens),
                template_kwargs=req.chat_template_kwargs,
            )
        )
    answer: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": replica.backend.max_model_len,
        "tokens": ids,
        "token_strs": [_tokenizer(replica).id_to_token(i) for i in ids] if req.return_token_strs else None,
    }
    return answer


@router.post("/detokenize", tags=["vllm"], summary="Text of token ids (vLLM's shape)")
async def detokenize(request: Request) -> Response:
    gw, data = await _auth_and_body(request)
    replica = replica_for(gw, data.get("model"))
    if replica.backend.kind == "openai":
        return await _passed_through(replica, "/detokenize", data)
    req: DetokenizeRequest = await asyncio.to_thread(_parsed, DetokenizeRequest, data)
    async with loaded(replica):
        tok = _tokenizer(replica)  # kept: it outlives an eviction of its engine
    bad = await asyncio.to_thread(lambda: [t for t in req.tokens if not 0 <= t < tok.vocab_size][:1])
    if bad:
        raise APIError(
            400, f"tokens: {bad[0]} is not a token id of `{replica.model}` (0-{tok.vocab_size - 1})", param="tokens"
        )
    text = await asyncio.to_thread(tok.decode, req.tokens, False)
    return Response(json.dumps({"prompt": text}, ensure_ascii=False), media_type=_JSON)


def _count_request(data: dict[str, Any]) -> tuple[Any, Any]:
    """The validated chat translation of a count_tokens body, and what it could not carry."""
    body, untranslatable = chat_body(data, is_count=True)
    err = untranslatable.error()
    if err is not None:
        raise err
    return chat_request(body, 1, is_generating=False), untranslatable  # the schema budget without max_tokens


async def count_message_tokens(gw: Any, data: dict[str, Any], headers: dict[str, str]) -> int:
    """``input_tokens`` of a count_tokens body: the engine's count for bundled models; upstreams
    are asked (their /v1/messages/count_tokens, else their /tokenize on the translation)."""
    replica = replica_for(gw, data.get("model"))
    backend = replica.backend
    if backend.kind == "openai":
        forwarded = {k: v for k, v in headers.items() if k in ("anthropic-version", "anthropic-beta")}
        bearer = _upstream_backend(replica).authorization()
        if bearer.startswith("Bearer "):  # as on /v1/messages: Anthropic-native servers read x-api-key
            forwarded["x-api-key"] = bearer[len("Bearer ") :]
        status, answer = await _upstream(replica, "/messages/count_tokens", data, forwarded, root=False)
        if status < 400 and isinstance(answer, dict) and isinstance(answer.get("input_tokens"), int):
            return answer["input_tokens"]
        if status not in (404, 405):
            raise _upstream_error(replica, "/v1/messages/count_tokens", status, answer)
    # the translation validated (tools, tool_choice, their schemas) in a worker thread: a
    # 300 KB tool schema holds Python for about a second
    greq, untranslatable = await asyncio.to_thread(_count_request, data)
    if backend.kind == "openai":
        upstream_body = {k: v for k, v in greq.body.items() if k in ("messages", "tools")}
        status, answer = await _upstream(replica, "/tokenize", upstream_body)
        if status >= 400 or not isinstance(answer, dict) or not isinstance(answer.get("count"), int):
            raise _upstream_error(replica, "/v1/messages/count_tokens or /tokenize", status, answer)
        return answer["count"]
    if untranslatable.text_only:  # a text-only model reads no image: a 400 naming it, as /v1/messages answers
        param, message = untranslatable.text_only[0]
        raise APIError(400, message, code="unsupported_content_type", param=param)
    try:
        async with loaded(replica):  # counted as the engine builds its prompt (tools as it renders them)
            local: Any = backend  # a LocalBackend (kind "local")
            ids = await asyncio.to_thread(local.prompt_token_ids, greq)
    except BackendError as e:
        raise APIError(400, str(e), param="model") from None
    return len(ids)


@router.get("/tokenizer_info", tags=["vllm"], summary="The tokenizer's configuration (vLLM's shape)")
async def tokenizer_info(request: Request) -> Response:
    """vLLM's ``GET /tokenizer_info``: class, special tokens, chat template, context length (lm-eval's
    ``tokenizer_backend=remote`` reads it). ``?model=`` picks a model (default: the default text model)."""
    gw = caller(request).gateway
    replica = replica_for(gw, request.query_params.get("model"))
    if replica.backend.kind == "openai":
        return await _passed_through_get(replica, "/tokenizer_info")
    async with loaded(replica):
        tok = _tokenizer(replica)
    special = getattr(tok, "special_tokens", {}) or {}
    answer = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # what transformers builds from a tokenizer.json
        "model": replica.model,
        "model_max_length": replica.backend.max_model_len,
        "chat_template": getattr(tok, "chat_template", None),
        "add_bos_token": bool(getattr(tok, "add_bos_token", False)),
        **{name: special.get(name) for name in ("bos_token", "eos_token", "pad_token", "unk_token")},
    }
    return Response(json.dumps(answer, ensure_ascii=False), media_type=_JSON)


async def _passed_through_get(replica: Replica, path: str) -> Response:
    backend = _upstream_backend(replica)
    try:
        r = await backend.send("GET", path)
        data = r.json()
    except RuntimeError:
        raise APIError(503, f"The model `{replica.model}` is not ready yet.", code="model_not_ready") from None
    except Exception as e:  # noqa: BLE001 - any transport or JSON failure is the upstream's
        raise APIError(502, f"{backend.name}: {path}: {type(e).__name__}", code="upstream_error") from None
    if r.status_code >= 400:
        raise _upstream_error(replica, path, r.status_code, data)
    return Response(json.dumps(data), media_type=_JSON)
