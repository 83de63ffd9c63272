"""Checks of the structured-output and tool-calling fields of a chat request, done
while the request is parsed, so bad ones get a 400 before any backend sees them
(and before any token is generated): ``response_format``, ``tools``, ``tool_choice``,
``parallel_tool_calls``.

Schemas are checked against the JSON Schema meta-schema (draft 2020-12, the draft
OpenAI's structured outputs use) with ``jsonschema``.
"""

from __future__ import annotations

import re
from typing import Any

from tokenops.gateway.errors import APIError

_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, code="invalid_value", param=param)


def check_schema(schema: Any, param: str) -> None:
    """400 unless ``schema`` is a JSON Schema (an object or a boolean that the meta-schema accepts)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, (dict, bool)):
        raise _bad(f"{param} must be a JSON Schema object, got {type(schema).__name__}", param)
    from tokenops.gateway.edge.schema_budget import check_schema_shape

    check_schema_shape(schema, param)  # cheap bounds first: a 100k-value enum never meets the meta-schema
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise _bad(
            f"{param} is not a valid JSON Schema: {e.message}" + (f" (at {where})" if where else ""), param
        ) from None


def check_response_format(response_format: Any) -> None:
    param = "response_format"
    if response_format is None:
        return
    if not isinstance(response_format, dict):
        raise _bad('response_format must be an object such as {"type": "json_object"}', param)
    kind = response_format.get("type")
    if kind in ("text", "json_object"):
        return
    if kind != "json_schema":
        raise _bad(
            f"response_format.type must be one of text, json_object, json_schema; got {kind!r}", "response_format.type"
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise _bad(
            "response_format.json_schema is required for type json_schema and must be an object",
            "response_format.json_schema",
        )
    name = spec.get("name")
    if name is not None and not (isinstance(name, str) and _FUNCTION_NAME.match(name)):
        raise _bad(
            "response_format.json_schema.name must be 1-64 characters of a-z, A-Z, 0-9, _ or -",
            "response_format.json_schema.name",
        )
    if "schema" in spec:
        check_schema(spec["schema"], "response_format.json_schema.schema")


def check_tools(tools: Any) -> list[str]:
    """The function names of a valid ``tools`` list (400 otherwise)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad('tools must be a list of {"type": "function", "function": {...}} objects', "tools")
    names: list[str] = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise _bad(f'{param}.type must be "function" (the only tool type chat completions take)', f"{param}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{param}.function must be an object with a name", f"{param}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
            raise _bad(
                f"{param}.function.name must be 1-64 characters of a-z, A-Z, 0-9, _ or -; got {name!r}",
                f"{param}.function.name",
            )
        if name in names:
            raise _bad(f"{param}.function.name {name!r} is defined twice", f"{param}.function.name")
        names.append(name)
        if "parameters" in fn:
            check_schema(fn["parameters"], f"{param}.function.parameters")
            if isinstance(fn["parameters"], dict) and fn["parameters"].get("type", "object") != "object":
                raise _bad(
                    f'{param}.function.parameters must describe an object ("type": "object")',
                    f"{param}.function.parameters",
                )
    return names


def check_tool_choice(tool_choice: Any, names: list[str]) -> None:
    param = "tool_choice"
    if tool_choice is None:
        return
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise _bad(f"tool_choice must be none, auto, required or a named function; got {tool_choice!r}", param)
        if tool_choice == "required" and not names:
            raise _bad('tool_choice is "required" but the request has no tools', param)
        return
    if (
        not isinstance(tool_choice, dict)
        or tool_choice.get("type") != "function"
        or not isinstance(tool_choice.get("function"), dict)
    ):
        raise _bad('tool_choice must be none, auto, required or {"type": "function", "function": {"name": ...}}', param)
    name = tool_choice["function"].get("name")
    if name not in names:
        known = ", ".join(names) if names else "none defined"
        raise _bad(f"tool_choice names the function {name!r}, which is not in tools ({known})", param)


def check_structured(body: dict[str, Any], max_tokens: int | None = None) -> None:
    """Check a chat request body's structured-output and tool fields, then the output
    their schemas force against ``max_tokens`` (:mod:`tokenops.gateway.edge.schema_budget`);
    raises a 400 APIError."""
    from tokenops.gateway.edge.schema_budget import check_request_schemas

    check_response_format(body.get("response_format"))
    names = check_tools(body.get("tools"))
    check_tool_choice(body.get("tool_choice"), names)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls must be true or false", "parallel_tool_calls")
    check_request_schemas(body, max_tokens)
