"""Whether a free tool call's arguments are valid for the function the request offers.

A free answer (``tool_choice`` auto, a native format: the model is not constrained) may call an
offered function with arguments its ``parameters`` schema refuses: a required one left out
(Qwen2.5-Coder greeted with "Hello!" beside a weather tool calls it with no city), one made up, a
wrong type. No client can run such a call as sent; the parsers leave it in the answer's text
(:meth:`tokenops.backends.tool_parsers.ToolCallStream.is_known`), so every call a client gets
is valid for its schema, as forced calls are by their grammar.
"""

from __future__ import annotations

import json
from typing import Any

Call = tuple[str, str]  # (name, arguments JSON text)


def arguments_match(arguments: str, schema: Any) -> bool:
    """Whether ``arguments`` (JSON text) is valid for ``schema`` (a function's ``parameters``; a
    missing one admits any object)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        value = json.loads(arguments)
    except ValueError:
        return False
    if not isinstance(schema, dict):
        return isinstance(value, dict)
    try:
        return bool(Draft202012Validator(schema).is_valid(value))
    except SchemaError:  # schemas are checked when the request is read (gateway/openai/structured.py)
        return isinstance(value, dict)


def call_of(obj: Any, args_keys: tuple[str, ...]) -> Call | None:
    """``(name, arguments)`` of one decoded call object, or None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    key = next((k for k in args_keys if k in obj), None)
    args = obj[key] if key is not None else {}
    if isinstance(args, str):  # arguments as a JSON string, as OpenAI writes them
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def json_values(text: str, separators: str) -> list[Any] | None:
    """The JSON values that make up ``text`` (between them only whitespace and ``separators``)."""
    decoder, at = json.JSONDecoder(), 0
    values: list[Any] = []
    while True:
        while at < len(text) and (text[at].isspace() or text[at] in separators):
            at += 1
        if at == len(text):
            return values or None
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)
