"""``POST /v1/responses`` bodies (OpenAI's Responses API) -> the gateway's one internal
chat request, so admission, routing, caching, budgets and telemetry run as for chat.

:func:`parse` validates the body (a 400 naming the field for a wrong type or value);
:func:`input_items` turns ``input`` into items in OpenAI's stored shape (ids added);
:func:`tokenops.gateway.responses.responses_chat.chat_body` translates the conversation (earlier turns, then this input) and the
fields into a chat completions body. Top-level fields with no chat equivalent are put
into the chat body under their own names: the bundled engine answers them with its 400
naming the field (``tokenops.gateway.core.fields``), an OpenAI-compatible upstream gets them
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
from tokenops.gateway.openai.metadata_bounds import Metadata

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
    "metadata": (
        "acts: kept with the response; at most 16 pairs, keys up to 64 and values up to 512 characters",
        _PASS_NATIVE,
    ),
    "tools": (
        "acts: `function` tools (as chat tools); hosted tools (`web_search`, `file_search`, `code_interpreter`, "
        "`computer_use_preview`, `image_generation`, `mcp`), `custom` and `local_shell` are a 400 naming the type",
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
    "max_output_tokens": ("acts: 1 to 2^31-1, as chat's `max_tokens`", _PASS_NATIVE),
    "temperature": ("acts", _PASS_NATIVE),
    "top_p": ("acts", _PASS_NATIVE),
    "top_logprobs": ("acts: `output_text` parts carry `logprobs`", _PASS_NATIVE),
    "include": (
        "acts: `message.output_text.logprobs` (logprobs on `output_text` parts); `reasoning.encrypted_content` "
        "accepted (reasoning items carry their text in `content`, no `encrypted_content`: nothing is kept "
        "encrypted here); OpenAI's values about hosted tools and input images accepted (such items never occur "
        "here); any other value is a 400 naming it",
        _PASS_NATIVE,
    ),
    "prompt_cache_key": (
        "acts: replica affinity (as chat's `prompt_cache_key`: the same key, the same replica)",
        _PASS_NATIVE,
    ),
    "reasoning": (
        "acts: `effort` is the thinking budget on models with a `reasoning_parser` (`xhigh` as `high`); a "
        "model that does not think spends no thinking tokens, within any effort: accepted; `summary` "
        "(`auto`, `concise`, `detailed`) accepted: no summarizer here, `reasoning` items carry the reasoning "
        "text in `content` and an empty `summary`; other keys are a 400 naming them",
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
    "prompt_cache_retention",
    "prompt_cache_options",
    "safety_identifier",
    "max_tool_calls",
    "context_management",
)
for _name in _REJECTED:
    FIELDS[_name] = ("400 naming it (not implemented)", _PASS_NATIVE)
LOGPROBS_INCLUDE = "message.output_text.logprobs"
#: OpenAI's ``include`` values: logprobs act; the others name items that never occur here (hosted
#: tools and images are refused, reasoning is not kept encrypted), so asking for them changes nothing.
INCLUDE_VALUES = (
    LOGPROBS_INCLUDE,
    "reasoning.encrypted_content",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
)
#: chat's bound on ``max_tokens`` (a signed 32-bit integer), for ``max_output_tokens`` too
MAX_OUTPUT_TOKENS = 2**31 - 1


class ResponsesRequest(BaseModel):
    """The fields tokenops reads itself; every other field is kept (``extra="allow"``)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: Metadata | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    truncation: str | None = None
    background: bool | None = None
    service_tier: str | None = None


def bad(message: str, param: str | None, code: str = "invalid_value") -> APIError:
    """A 400 naming ``param``, as OpenAI answers a wrong field."""
    return APIError(400, message, code=code, param=param)


def parse(data: dict[str, Any]) -> ResponsesRequest:
    try:
        return ResponsesRequest.model_validate(data, strict=True)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise bad(f"{loc}: {err.get('msg', 'invalid value')}" if loc else "invalid request", loc or None) from None


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- input items --------------------------------------------------------------

TEXT_PARTS = ("input_text", "output_text", "text")


class Translation:
    """What the chat translation could not carry. An upstream serving ``/v1/responses``
    takes the request as written, so these are 400s only where the translation is
    answered: ``untranslatable`` (built-in tools, other item types, ...) on the bundled
    engine and chat-only upstreams; ``text_only`` (image, file and audio parts, which
    become chat's own parts for a chat upstream) on the bundled engine."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset  # items of earlier turns before this request's input
        self.stored: list[dict[str, Any]] = []  # this request's own input items as they are stored
        #: whether the model thinks (a bundled model with a ``reasoning_parser``); None: not known here
        self.is_reasoning_model: bool | None = None
        self.untranslatable: dict[str, APIError] = {}
        self.text_only: dict[str, APIError] = {}

    def defer(self, param: str, message: str, code: str) -> None:
        self.untranslatable.setdefault(param, bad(message, param, code))

    def item_param(self, index: int) -> str:
        return f"input[{index - self.offset}]" if index >= self.offset else f"previous_response_id (item {index})"


def _content(content: Any, param: str) -> list[dict[str, Any]]:
    """A message's content as parts (a string is one ``input_text``); text parts need text."""
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        raise bad(f"{param} must be a string or a list of content parts", param)
    for i, part in enumerate(content):
        if part.get("type") in TEXT_PARTS and not isinstance(part.get("text"), str):
            raise bad(f"{param}[{i}].text must be a string", f"{param}[{i}].text")
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
                raise bad(f"{param}.role must be user, system, developer or assistant; got {role!r}", f"{param}.role")
            content = _content(raw.get("content"), f"{param}.content")
            if role == "assistant":
                content = [
                    {"type": "output_text", "text": p["text"], "annotations": p.get("annotations", [])}
                    if p.get("type") in TEXT_PARTS
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
                    raise bad(f"{param}.{key} must be a string", f"{param}.{key}")
            item.setdefault("id", new_id("fc"))
            item.setdefault("status", "completed")
        elif kind == "function_call_output":
            if not isinstance(raw.get("call_id"), str):
                raise bad(f"{param}.call_id must be a string", f"{param}.call_id")
            if not isinstance(raw.get("output"), str):
                item["output"] = _content(raw.get("output"), f"{param}.output")
            item.setdefault("id", new_id("fco"))
            item.setdefault("status", "completed")
        items.append(item)
    return items


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
