"""``POST /v1/responses`` bodies (OpenAI's Responses API) -> the gateway's one internal
chat request, so admission, routing, caching, budgets and telemetry run as for chat.

:func:`parse` validates the body (a 400 naming the field for a wrong type or value);
:func:`input_items` turns ``input`` into items in OpenAI's stored shape (ids added);
:func:`chat_body` translates the conversation (earlier turns, then this input) and the
fields into a chat completions body. Top-level fields with no chat equivalent are put
into the chat body under their own names: the bundled engine answers them with its 400
naming the field (``tokenops.gateway.fields``), an OpenAI-compatible upstream gets them
as sent. What chat cannot carry at all is kept in a :class:`Translation`. An upstream
that serves ``/v1/responses`` itself gets the Responses body instead
(``GatewayRequest.native``, :mod:`tokenops.backends.openai_responses`).

:data:`FIELDS` says what happens to every field; docs/serve.md carries
:func:`markdown` (a test compares them).
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenops.gateway.errors import APIError
from tokenops.gateway.structured import check_structured

_PASS_NATIVE = "passes through"
#: name -> (what the bundled engine does, what an upstream serving /v1/responses gets)
FIELDS: dict[str, tuple[str, str]] = {
    "model": ("acts: picks the model (routers may choose another)", "acts: sent as the upstream's own id"),
    "input": (
        "acts: a string, or items: `message` (text parts), `function_call`, `function_call_output`; "
        "`reasoning` items are kept in the conversation but not shown to the model; image, file and "
        "audio parts (chat's `image_url`, `file`, `input_audio` parts for a chat upstream) and other item "
        "types are a 400 naming them",
        "acts: sent with the earlier turns",
    ),
    "instructions": (
        "acts: a system message before the input (not carried into the next turn, as OpenAI)",
        _PASS_NATIVE,
    ),
    "previous_response_id": (
        "acts: the stored conversation (this tenant's only) goes before the input; 404 when unknown",
        "acts: resolved by the gateway, the upstream gets the whole input",
    ),
    "store": (
        "acts (default true): kept in the store per tenant, bounded by `[store] responses_*`",
        "acts as on the bundled engine; the upstream gets `store: false`",
    ),
    "metadata": ("acts: kept with the response", _PASS_NATIVE),
    "tools": (
        "acts: `function` tools (as chat tools); other tool types (`web_search`, ...) are a 400 naming them",
        _PASS_NATIVE,
    ),
    "tool_choice": (
        'acts: `auto`, `none`, `required`, `{"type": "function", "name": ...}` (grammar-constrained)',
        _PASS_NATIVE,
    ),
    "parallel_tool_calls": ("acts", _PASS_NATIVE),
    "text": (
        "acts: `format` `text`, `json_object`, `json_schema` (grammar-constrained); "
        "`verbosity` other than `medium` is a 400",
        _PASS_NATIVE,
    ),
    "max_output_tokens": ("acts", _PASS_NATIVE),
    "temperature": ("acts", _PASS_NATIVE),
    "top_p": ("acts", _PASS_NATIVE),
    "top_logprobs": ("acts: `output_text` parts carry `logprobs`", _PASS_NATIVE),
    "include": ("acts: `message.output_text.logprobs`; other values are a 400", _PASS_NATIVE),
    "reasoning": (
        "acts: `effort` on models with a `reasoning_parser` (400 on others); output has `reasoning` "
        "items; `summary` is a 400 (no summaries)",
        _PASS_NATIVE,
    ),
    "stream": (
        "acts: OpenAI's typed events, in OpenAI's order, with `sequence_number`",
        "acts: the upstream's events are translated back into the gateway's",
    ),
    "stream_options": ("acts: `include_obfuscation: false`; true is a 400 (no obfuscation padding)", _PASS_NATIVE),
    "user": ("acts: session hint; the tenant on an open server", _PASS_NATIVE),
    "truncation": ("`disabled` accepted; `auto` is a 400 (turns are never dropped)", _PASS_NATIVE),
    "background": ("`false` accepted; true is a 400 (no background mode)", _PASS_NATIVE),
    "service_tier": ("`auto` and `default` accepted; others are a 400", _PASS_NATIVE),
}
_REJECTED = (
    "conversation",
    "prompt",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "safety_identifier",
    "max_tool_calls",
    "context_management",
)
for _name in _REJECTED:
    FIELDS[_name] = ("400 naming it (not implemented)", _PASS_NATIVE)
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class ResponsesRequest(BaseModel):
    """The fields tokenops reads itself; every other field is kept (``extra="allow"``)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] | None = Field(None, max_length=16)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    truncation: str | None = None
    background: bool | None = None
    service_tier: str | None = None


def _bad(message: str, param: str | None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, code=code, param=param)


def parse(data: dict[str, Any]) -> ResponsesRequest:
    try:
        return ResponsesRequest.model_validate(data, strict=True)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise _bad(f"{loc}: {err.get('msg', 'invalid value')}" if loc else "invalid request", loc or None) from None


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- input items --------------------------------------------------------------

_TEXT_PARTS = ("input_text", "output_text", "text")


class Translation:
    """What the chat translation could not carry. An upstream serving ``/v1/responses``
    takes the request as written, so these are 400s only where the translation is
    answered: ``untranslatable`` (built-in tools, other item types, ...) on the bundled
    engine and chat-only upstreams; ``text_only`` (image, file and audio parts, which
    become chat's own parts for a chat upstream) on the bundled engine."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset  # items of earlier turns before this request's input
        self.untranslatable: dict[str, APIError] = {}
        self.text_only: dict[str, APIError] = {}

    def defer(self, param: str, message: str, code: str) -> None:
        self.untranslatable.setdefault(param, _bad(message, param, code))

    def item_param(self, index: int) -> str:
        return f"input[{index - self.offset}]" if index >= self.offset else f"previous_response_id (item {index})"


def _content(content: Any, param: str) -> list[dict[str, Any]]:
    """A message's content as parts (a string is one ``input_text``); text parts need text."""
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        raise _bad(f"{param} must be a string or a list of content parts", param)
    for i, part in enumerate(content):
        if part.get("type") in _TEXT_PARTS and not isinstance(part.get("text"), str):
            raise _bad(f"{param}[{i}].text must be a string", f"{param}[{i}].text")
    return content


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """``input`` as items in the shape ``GET /v1/responses/{id}/input_items`` lists them."""
    if isinstance(req.input, str):
        return [
            {
                "id": new_id("msg"),
                "type": "message",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_text", "text": req.input}],
            }
        ]
    items = []
    for i, raw in enumerate(req.input):
        param = f"input[{i}]"
        kind = raw.get("type", "message")
        item = dict(raw)
        if kind == "message":
            role = raw.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(f"{param}.role must be user, system, developer or assistant; got {role!r}", f"{param}.role")
            content = _content(raw.get("content"), f"{param}.content")
            if role == "assistant":
                content = [
                    {"type": "output_text", "text": p["text"], "annotations": p.get("annotations", [])}
                    if p.get("type") in _TEXT_PARTS
                    else p
                    for p in content
                ]
            item = {
                "id": raw.get("id") or new_id("msg"),
                "type": "message",
                "role": role,
                "status": raw.get("status") or "completed",
                "content": content,
            }
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(raw.get(key), str):
                    raise _bad(f"{param}.{key} must be a string", f"{param}.{key}")
            item.setdefault("id", new_id("fc"))
            item.setdefault("status", "completed")
        elif kind == "function_call_output":
            if not isinstance(raw.get("call_id"), str):
                raise _bad(f"{param}.call_id must be a string", f"{param}.call_id")
            if not isinstance(raw.get("output"), str):
                item["output"] = _content(raw.get("output"), f"{param}.output")
            item.setdefault("id", new_id("fco"))
            item.setdefault("status", "completed")
        items.append(item)
    return items


_CHAT_PARTS = {"input_image": "image_url", "input_file": "file", "input_audio": "input_audio"}


def _chat_content(parts: list[dict[str, Any]], param: str, tr: Translation) -> str | list[dict[str, Any]]:
    """Content parts as chat content: text joined into a string, or chat parts (images as
    ``image_url`` ...) which a text-only model refuses, naming the part."""
    if all(p.get("type") in _TEXT_PARTS or p.get("type") == "refusal" for p in parts):
        return "".join(p.get("text") or p.get("refusal") or "" for p in parts)
    out: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        kind = part.get("type")
        if kind in _TEXT_PARTS or kind == "refusal":
            out.append({"type": "text", "text": part.get("text") or part.get("refusal") or ""})
            continue
        where = f"{param}[{i}].type"
        tr.text_only.setdefault(
            where,
            _bad(
                f"{param}[{i}]: content parts of type {kind!r} are not supported by this "
                "model: it reads text only (input_text)",
                where,
                "unsupported_content_type",
            ),
        )
        if kind == "input_image" and part.get("image_url"):
            out.append(
                {"type": "image_url", "image_url": {"url": part["image_url"], "detail": part.get("detail") or "auto"}}
            )
        elif kind == "input_file":
            out.append(
                {"type": "file", "file": {k: part[k] for k in ("file_id", "file_data", "filename") if k in part}}
            )
        elif kind == "input_audio":
            out.append({"type": "input_audio", "input_audio": part.get("input_audio")})
    return out


def chat_messages(items: list[dict[str, Any]], instructions: str | None, tr: Translation) -> list[dict[str, Any]]:
    """Items -> chat messages: consecutive ``function_call`` items become one assistant
    message's ``tool_calls`` (after that turn's assistant text, when there is one)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        param = tr.item_param(index)
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _chat_content(item["content"], f"{param}.content", tr)})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last.get("content") or None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item["output"]
            content = output if isinstance(output, str) else _chat_content(output, f"{param}.output", tr)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        elif kind != "reasoning":  # reasoning stays in the conversation, unseen by the model
            tr.defer(
                f"{param}.type",
                f"{param}: input items of type {kind!r} are not supported by this model "
                "(message, function_call, function_call_output and reasoning are)",
                "unsupported_item_type",
            )
    if not messages:
        raise _bad("input is empty: send a string or at least one message", "input")
    return messages


# -- the other fields -----------------------------------------------------------


def _chat_tools(tools: list[dict[str, Any]], tr: Translation) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            tr.defer(
                f"tools[{i}].type",
                f"tools[{i}]: tools of type {tool.get('type')!r} are not supported by this model (function tools are)",
                "unsupported_tool_type",
            )
            continue
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(choice: Any, tr: Translation) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict):
        tr.defer(
            "tool_choice.type",
            f"tool_choice of type {choice.get('type')!r} is not supported by this model",
            "unsupported_tool_type",
        )
        return None
    return choice


def _response_format(text: dict[str, Any]) -> dict[str, Any] | None:
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _bad('text.format must be an object such as {"type": "text"}', "text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    if kind in ("text", "json_object"):
        return {"type": kind}
    raise _bad(f"text.format.type must be text, json_object or json_schema; got {kind!r}", "text.format.type")


_CHAT_NAMES = {
    "reasoning_effort": "reasoning.effort",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "messages": "input",
    "logprobs": "include",
}


def responses_error(e: APIError) -> APIError:
    """An error about the chat request (its checks, the backend's 400s) in the Responses
    API's field names: ``tools[0].function.parameters`` -> ``tools[0].parameters``,
    ``response_format`` -> ``text.format``, ``reasoning_effort`` -> ``reasoning.effort``."""

    def fix(s: str) -> str:
        s = (
            s.replace(".function.", ".")
            .replace("response_format.json_schema", "text.format")
            .replace("response_format", "text.format")
        )
        for chat, ours in _CHAT_NAMES.items():
            s = s.replace(f"`{chat}`", f"`{ours}`")
        return s

    param = e.param
    if param is None:  # a backend's 400 that names the field only in its message
        param = next((ours for chat, ours in _CHAT_NAMES.items() if f"`{chat}`" in e.message), None)
    else:
        param = _CHAT_NAMES.get(param, fix(param))
    return APIError(e.status, fix(e.message), code=e.code, param=param, type=e.type, headers=e.headers)


def chat_body(req: ResponsesRequest, items: list[dict[str, Any]], tr: Translation) -> dict[str, Any]:
    """The chat completions body answering ``req`` over the conversation ``items``
    (what it cannot express is kept in ``tr``)."""
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(items, req.instructions, tr)}
    for name in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if req.tools and (tools := _chat_tools(req.tools, tr)):
        body["tools"] = tools
    if req.tool_choice is not None and (choice := _chat_tool_choice(req.tool_choice, tr)) is not None:
        body["tool_choice"] = choice
    if req.text:
        for key in sorted(k for k in req.text if k not in ("format", "verbosity")):
            tr.defer(f"text.{key}", f"text.{key} is not a field this model knows", "unsupported_parameter")
        if (fmt := _response_format(req.text)) is not None:
            body["response_format"] = fmt
        if req.text.get("verbosity") not in (None, "medium"):
            body["verbosity"] = req.text["verbosity"]
    include = [v for v in req.include or () if v != LOGPROBS_INCLUDE]
    if include:
        body["include"] = include
    if req.top_logprobs or LOGPROBS_INCLUDE in (req.include or ()):
        body["logprobs"] = True
        if req.top_logprobs:
            body["top_logprobs"] = req.top_logprobs
    if req.reasoning:
        effort = req.reasoning.get("effort")
        if effort is not None:
            body["reasoning_effort"] = effort
        rest = {k: v for k, v in req.reasoning.items() if k != "effort" and v is not None}
        if rest:
            body["reasoning"] = rest
    if (req.stream_options or {}).get("include_obfuscation"):
        tr.defer(
            "stream_options.include_obfuscation",
            "stream_options.include_obfuscation: no obfuscation padding is sent here; send false",
            "unsupported_parameter",
        )
    if req.truncation not in (None, "disabled"):
        body["truncation"] = req.truncation
    if req.background:
        body["background"] = True
    if req.service_tier not in (None, "auto", "default"):
        body["service_tier"] = req.service_tier
    for name, value in (req.model_extra or {}).items():  # fields with no chat equivalent, or unknown ones
        if value is not None:
            if name in body or name in (
                "messages",
                "max_tokens",
                "max_completion_tokens",
                "n",
                "stream",
                "stream_options",
            ):
                raise _bad(f"Unknown parameter: '{name}'.", name, code="unknown_parameter")
            body[name] = value
    try:
        check_structured(body)
    except APIError as e:
        raise responses_error(e) from None
    return body


def deferred_error(e: APIError, tr: Translation) -> APIError:
    """The error of a pipeline failure, with a deferred translation problem's own message."""
    return tr.untranslatable.get(e.param or "") or responses_error(e)


def markdown() -> str:
    """The field table of docs/serve.md."""
    rows = [
        "`POST /v1/responses`",
        "",
        "| field | bundled engine (`local`); an upstream without `/v1/responses` gets "
        "the same chat translation, the fields refused here passed through | upstream serving `/v1/responses` |",
        "|---|---|---|",
    ]
    rows += [f"| `{name}` | {bundled} | {native} |" for name, (bundled, native) in FIELDS.items()]
    rows.append("| any other field | 400 naming it (`unsupported_parameter`) | passes through |")
    return "\n".join(rows) + "\n"
