"""A Responses API request (parsed by :mod:`tokenops.gateway.responses.responses_request`) as the one
chat completions body the gateway runs, and chat-side errors back in the Responses API's names.

Apart from the parsing because the two change for different reasons: the request side follows
OpenAI's Responses schema, this side follows what chat completions (and the bundled engine's
field checks) can express. What chat cannot carry is kept in the request's :class:`Translation`
and answered as a 400 only where the translation is what runs.
"""

from __future__ import annotations

from typing import Any

from tokenops.gateway.errors import APIError
from tokenops.gateway.openai.structured import check_structured
from tokenops.gateway.responses.responses_request import (
    INCLUDE_VALUES,
    LOGPROBS_INCLUDE,
    TEXT_PARTS,
    ResponsesRequest,
    Translation,
    bad,
)

_CHAT_PARTS = {"input_image": "image_url", "input_file": "file", "input_audio": "input_audio"}


def _chat_content(parts: list[dict[str, Any]], param: str, tr: Translation) -> str | list[dict[str, Any]]:
    """Content parts as chat content: text joined into a string, or chat parts (images as
    ``image_url`` ...) which a text-only model refuses, naming the part."""
    if all(p.get("type") in TEXT_PARTS or p.get("type") == "refusal" for p in parts):
        return "".join(p.get("text") or p.get("refusal") or "" for p in parts)
    out: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        kind = part.get("type")
        if kind in TEXT_PARTS or kind == "refusal":
            out.append({"type": "text", "text": part.get("text") or part.get("refusal") or ""})
            continue
        where = f"{param}[{i}].type"
        tr.text_only.setdefault(
            where,
            bad(
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
        raise bad("input is empty: send a string or at least one message", "input")
    return messages


# -- the other fields -----------------------------------------------------------


_HOSTED_TOOLS = (
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "image_generation",
    "mcp",
)


def _tool_refusal(kind: Any) -> str:
    """Why a tool of type ``kind`` cannot run here, and what to send instead."""
    if kind in _HOSTED_TOOLS:
        return f"`{kind}` is a hosted tool (OpenAI runs it on its servers); none run here: define a `function` tool"
    if kind == "custom":
        return "`custom` (free-form) tools are not implemented: define a `function` tool with a string parameter"
    if kind == "local_shell":
        return "`local_shell` is not implemented: define a `function` tool (e.g. `shell` with a `command` parameter)"
    return f"tools of type {kind!r} are not supported by this model (function tools are)"


def _chat_tools(tools: list[dict[str, Any]], tr: Translation) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            tr.defer(f"tools[{i}].type", f"tools[{i}]: {_tool_refusal(tool.get('type'))}", "unsupported_tool_type")
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
        raise bad('text.format must be an object such as {"type": "text"}', "text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    if kind in ("text", "json_object"):
        return {"type": kind}
    raise bad(f"text.format.type must be text, json_object or json_schema; got {kind!r}", "text.format.type")


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


_EFFORTS = {"none": "none", "minimal": "minimal", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
_SUMMARIES = ("auto", "concise", "detailed")


def _reasoning(reasoning: dict[str, Any], body: dict[str, Any], tr: Translation) -> None:
    """``reasoning``: ``effort`` as chat's ``reasoning_effort`` (the thinking budget) for a model that
    thinks or may (an upstream); a model that does not think is within any effort. ``summary`` is
    accepted: there is no summarizer, reasoning items carry their text in ``content``."""
    for key, value in reasoning.items():
        if key not in ("effort", "summary", "generate_summary"):
            raise bad(f"reasoning.{key}: unknown field (effort, summary are)", f"reasoning.{key}")
        if key != "effort" and value is not None and value not in _SUMMARIES:
            raise bad(f"reasoning.{key} must be one of {', '.join(_SUMMARIES)}; got {value!r}", f"reasoning.{key}")
    effort = reasoning.get("effort")
    if effort is None:
        return
    if effort not in _EFFORTS:
        raise bad(f"reasoning.effort must be one of {', '.join(_EFFORTS)}; got {effort!r}", "reasoning.effort")
    if tr.is_reasoning_model is not False:
        body["reasoning_effort"] = _EFFORTS[effort]


def chat_body(
    req: ResponsesRequest, items: list[dict[str, Any]], tr: Translation, default_max_tokens: int | None = None
) -> dict[str, Any]:
    """The chat completions body answering ``req`` over the conversation ``items``
    (what it cannot express is kept in ``tr``). Its schemas are held to the output
    ``max_output_tokens`` (else ``default_max_tokens``) can hold, as chat's to ``max_tokens``."""
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(items, req.instructions, tr)}
    for name in ("temperature", "top_p", "parallel_tool_calls", "user", "prompt_cache_key"):
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
    for i, value in enumerate(req.include or ()):
        if value not in INCLUDE_VALUES:
            raise bad(f"include[{i}]: {value!r} is not an include value ({', '.join(INCLUDE_VALUES)})", f"include[{i}]")
    if req.top_logprobs or LOGPROBS_INCLUDE in (req.include or ()):
        body["logprobs"] = True
        if req.top_logprobs:
            body["top_logprobs"] = req.top_logprobs
    if req.reasoning:
        _reasoning(req.reasoning, body, tr)
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
                raise bad(f"Unknown parameter: '{name}'.", name, code="unknown_parameter")
            body[name] = value
    try:
        check_structured(body, req.max_output_tokens or default_max_tokens)  # the one schema budget
    except APIError as e:
        raise responses_error(e) from None
    return body


def deferred_error(e: APIError, tr: Translation) -> APIError:
    """The error of a pipeline failure, with a deferred translation problem's own message."""
    return tr.untranslatable.get(e.param or "") or responses_error(e)
