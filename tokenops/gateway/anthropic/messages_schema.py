"""Anthropic Messages API request bodies and their translation to the gateway's one
internal request (a chat-completions body), so admission, routing, caching, budgets and
telemetry run exactly as for ``/v1/chat/completions``.

The field table :data:`FIELDS` is the one source of what each field does (docs/serve.md
carries :func:`markdown`). A field Anthropic's API does not have is a 400 naming it, as
Anthropic answers. A field it has that the translation cannot carry (``container``,
``mcp_servers``, server tools, ``document`` blocks...) reaches an upstream that serves
``/v1/messages`` as sent, and is a 400 naming it everywhere else.

The top-level fields are translated here; ``system`` and the messages' content blocks in
:mod:`tokenops.gateway.anthropic.messages_content`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tokenops.gateway.anthropic.messages_content import Untranslatable, bad, chat_messages, require
from tokenops.gateway.errors import APIError

PASS = "passes through"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    translated: str  # what the translation to chat completions (bundled engine, chat-only upstreams) does
    native: str = PASS  # what an upstream serving /v1/messages gets


def _no(reason: str) -> str:
    return f"400 ({reason})"


FIELDS = [
    Field("model", "acts: picks the model (routers may choose another)", "acts: sent as the upstream's own id"),
    Field(
        "max_tokens",
        "acts; `0` pre-fills the prefix cache: the prompt is run, nothing is generated, the answer is "
        "empty (`stop_reason` `max_tokens`) with its usage",
    ),
    Field(
        "messages",
        "acts: `text`, `image` (an `image_url` part for a chat upstream; a 400 naming it on the text-only "
        "bundled models), `tool_use`, `tool_result` blocks; earlier "
        "`thinking`/`redacted_thinking` blocks are dropped (chat templates drop them too); other block types 400; "
        "a last `assistant` message (prefill) 400",
    ),
    Field("system", "acts: a string or `text` blocks, sent as the system message"),
    Field("stop_sequences", "acts: sent as `stop`; the matched one comes back as `stop_sequence`"),
    Field("stream", "acts: Anthropic's event stream"),
    Field("temperature", "acts (0-1)"),
    Field("top_p", "acts"),
    Field("top_k", "acts"),
    Field("tools", "acts: custom tools (`input_schema` -> `parameters`); server tools 400"),
    Field(
        "tool_choice",
        "acts: `auto`, `any` (a call is forced), `tool` (that tool is forced), `none`; "
        "forced calls are grammar-constrained; `disable_parallel_tool_use` acts",
    ),
    Field(
        "thinking",
        "acts on models with a `reasoning_parser`: `enabled` sets the thinking budget "
        "(`budget_tokens`), `disabled` turns thinking off, `adaptive` leaves it to the model; `enabled` on "
        'other models 400; `display: "omitted"` leaves the thinking text out of the answer',
    ),
    Field(
        "output_config",
        "acts: `format` (`json_schema`) as `response_format`, `effort` as `reasoning_effort` (`xhigh`/`max` as `high`)",
    ),
    Field("metadata", "acts: `user_id` is the session hint (the tenant on an open server)"),
    Field("cache_control", "acts: accepted at the top and on blocks; the prefix cache needs no marks"),
    Field("service_tier", "acts: one tier (`auto` and `standard_only` accepted)"),
    Field("speed", _no('one speed; "standard" is accepted')),
    Field("container", _no("no code-execution containers")),
    Field("mcp_servers", _no("no MCP connector")),
    Field("context_management", _no("not implemented")),
    Field("diagnostics", _no("not implemented")),
    Field("inference_geo", _no("one location")),
    Field("user_profile_id", _no("not implemented")),
    Field("workspace_id", _no("not implemented")),
]
_BY_NAME = {f.name: f for f in FIELDS}
#: Fields of count_tokens (a subset: no sampling, no stream).
COUNT_FIELDS = (
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "cache_control",
    "mcp_servers",
    "context_management",
    "speed",
    "user_profile_id",
    "workspace_id",
)
_NEUTRAL = {"speed": ("standard", None), "service_tier": ("auto", "standard_only", None)}
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def check_fields(data: dict[str, Any], *, is_count: bool = False) -> None:
    """400 naming every field the Messages API does not have (as Anthropic answers)."""
    known = set(COUNT_FIELDS) if is_count else set(_BY_NAME)
    unknown = [k for k in data if k not in known]
    if unknown:
        names = ", ".join(f"`{k}`" for k in unknown)
        raise bad(
            f"Unknown field{'s' if len(unknown) > 1 else ''} {names}: not part of the Messages API "
            f"({'/v1/messages/count_tokens' if is_count else '/v1/messages'}). Remove "
            f"{'them' if len(unknown) > 1 else 'it'}.",
            param=unknown[0],
        )
    for required in ("model", "messages") + (() if is_count else ("max_tokens",)):
        if required not in data:
            raise bad(f"{required}: Field required", param=required)


def _tools(tools: Any, problems: Untranslatable) -> list[dict[str, Any]]:
    require(isinstance(tools, list), "must be a list of tools", "tools")
    out = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        require(isinstance(tool, dict), "must be an object", param)
        if tool.get("type") not in (None, "custom"):
            problems.note(
                f"{param}.type {tool.get('type')!r}: server tools cannot be translated; define a custom "
                "tool (name, description, input_schema)",
                f"{param}.type",
            )
            continue
        extra = set(tool) - {"name", "description", "input_schema", "type", "cache_control", "strict"}
        require(not extra, f"unknown or unsupported field(s) {', '.join(sorted(extra))}", param)
        require(isinstance(tool.get("name"), str), "needs a string name", f"{param}.name")
        require(isinstance(tool.get("input_schema"), dict), "needs an input_schema object", f"{param}.input_schema")
        fn: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, body: dict[str, Any]) -> None:
    require(
        isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none"),
        'must be {"type": "auto" | "any" | "tool" | "none"}',
        "tool_choice",
    )
    kind = choice["type"]
    if kind == "tool":
        require(isinstance(choice.get("name"), str), 'type "tool" needs the tool\'s name', "tool_choice.name")
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if body.get("tools") and kind != "none":
        body["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use", False)


def _thinking(thinking: Any, body: dict[str, Any], is_reasoning_model: bool | None, problems: Untranslatable) -> None:
    require(
        isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled", "adaptive", "between_tools"),
        'must be {"type": "enabled", "budget_tokens": N}, {"type": "disabled"} or {"type": "adaptive"}',
        "thinking",
    )
    kind = thinking["type"]
    extra = set(thinking) - {"type", "budget_tokens", "display"}
    require(not extra, f"unknown field(s) {', '.join(sorted(extra))}", "thinking")
    require(
        thinking.get("display") in (None, "summarized", "omitted"),
        'must be "summarized" or "omitted"',
        "thinking.display",
    )
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        require(
            isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0,
            "must be an integer >= 0",
            "thinking.budget_tokens",
        )
        body["max_thinking_tokens"] = budget
        if is_reasoning_model is False:
            problems.note(
                "thinking: this model does not think (it has no `reasoning_parser` in [[models]]); "
                "remove `thinking` or use a reasoning model",
                "thinking",
            )
    elif kind == "disabled" and is_reasoning_model:
        body["max_thinking_tokens"] = 0


def _output_config(config: Any, body: dict[str, Any]) -> None:
    require(isinstance(config, dict), "must be an object", "output_config")
    extra = set(config) - {"format", "effort"}
    require(not extra, f"unknown field(s) {', '.join(sorted(extra))}", "output_config")
    fmt = config.get("format")
    if fmt is not None:
        require(
            isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict),
            'must be {"type": "json_schema", "schema": {...}}',
            "output_config.format",
        )
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    effort = config.get("effort")
    if effort is not None:
        require(effort in _EFFORT, f"must be one of {', '.join(_EFFORT)}", "output_config.effort")
        body["reasoning_effort"] = _EFFORT[effort]


def chat_body(
    data: dict[str, Any], *, is_reasoning_model: bool | None = None, is_count: bool = False
) -> tuple[dict[str, Any], Untranslatable]:
    """The chat-completions body of a Messages request, and the 400s of what it could not carry
    (malformed requests raise at once)."""
    check_fields(data, is_count=is_count)
    problems = Untranslatable()
    for name, value in data.items():
        f = _BY_NAME.get(name)
        if f is not None and f.translated.startswith("400") and value not in _NEUTRAL.get(name, (None,)):
            problems.note(
                f"Unsupported parameter `{name}` for this model: {f.translated[5:-1]}. Remove it, or send "
                "it to a model whose upstream serves /v1/messages (the gateway passes it through there).",
                name,
            )
    if data.get("service_tier") not in _NEUTRAL["service_tier"]:
        raise bad('service_tier must be "auto" or "standard_only"', param="service_tier")
    body: dict[str, Any] = {"model": data["model"], "messages": chat_messages(data, problems)}
    if not is_count:
        body["max_tokens"] = data["max_tokens"]
        stream = data.get("stream", False)
        require(isinstance(stream, bool), "must be true or false", "stream")
        body["stream"] = stream
        if stream:
            body["stream_options"] = {"include_usage": True}
        temperature = data.get("temperature")
        if temperature is not None:
            require(
                isinstance(temperature, (int, float)) and 0 <= temperature <= 1,
                "must be between 0 and 1",
                "temperature",
            )
            body["temperature"] = temperature
        for name in ("top_p", "top_k"):
            if data.get(name) is not None:
                body[name] = data[name]
        stops = data.get("stop_sequences")
        if stops is not None:
            require(
                isinstance(stops, list) and all(isinstance(s, str) and s for s in stops),
                "must be a list of non-empty strings",
                "stop_sequences",
            )
            if stops:
                body["stop"] = stops
        metadata = data.get("metadata")
        if metadata is not None:
            require(isinstance(metadata, dict) and set(metadata) <= {"user_id"}, "only user_id is known", "metadata")
            if metadata.get("user_id") is not None:
                body["user"] = metadata["user_id"]
    if data.get("tools") is not None:
        body["tools"] = _tools(data["tools"], problems)
    if data.get("tool_choice") is not None:
        _tool_choice(data["tool_choice"], body)
    if data.get("thinking") is not None:
        _thinking(data["thinking"], body, is_reasoning_model, problems)
    if data.get("output_config") is not None:
        _output_config(data["output_config"], body)
    return body, problems


#: The chat translation's field names back in the Messages API's (most specific first).
_MESSAGES_NAMES = [
    (re.compile(r"tools(?:\.|\[)(\d+)\]?\.function\.parameters"), r"tools[\1].input_schema"),
    (re.compile(r"tools(?:\.|\[)(\d+)\]?\.function\.(name|description)"), r"tools[\1].\2"),
    (re.compile(r"tools(?:\.|\[)(\d+)\]?\.function\b"), r"tools[\1]"),
    (re.compile(r"response_format(?:\.json_schema)?\.schema"), "output_config.format.schema"),
    (re.compile(r"response_format(?:\.json_schema)?"), "output_config.format"),
    (re.compile(r"\bmax_thinking_tokens\b"), "thinking.budget_tokens"),
    (re.compile(r"\breasoning_effort\b"), "output_config.effort"),
]
#: Whole parameters renamed (only as ``param``: the words are too common to replace in text).
_MESSAGES_PARAMS = {"stop": "stop_sequences", "user": "metadata.user_id"}


def messages_error(e: APIError) -> APIError:
    """An error about the translated chat request (its checks, the schema budget, a backend's 400)
    in the Messages API's names: ``tools[0].function.parameters`` -> ``tools[0].input_schema``,
    ``response_format`` -> ``output_config.format``, ``max_thinking_tokens`` -> ``thinking.budget_tokens``."""

    def fix(text: str) -> str:
        for pattern, ours in _MESSAGES_NAMES:
            text = pattern.sub(ours, text)
        return text

    param = None if e.param is None else _MESSAGES_PARAMS.get(e.param, fix(e.param))
    return APIError(e.status, fix(e.message), code=e.code, param=param, type=e.type, headers=e.headers)


def markdown() -> str:
    """The field table of docs/serve.md."""
    counted = ", ".join(f"`{name}`" for name in COUNT_FIELDS)
    rows = [
        f"`POST /v1/messages` (`POST /v1/messages/count_tokens` takes {counted}, the same way)\n",
        "| field | bundled engine, chat-only upstreams (translated) | upstream serving `/v1/messages` |",
        "|---|---|---|",
    ]
    rows += [f"| `{f.name}` | {f.translated} | {f.native} |" for f in FIELDS]
    rows.append("| any other field | 400 naming it (as Anthropic answers) | 400 naming it |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
