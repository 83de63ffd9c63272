"""The request checks of tokenops/gateway/openai/structured.py (the 400s before any backend);
tests/gateway/test_structured_serve.py sends some of them through tokenops serve."""

from __future__ import annotations

import pytest
from tokenops.gateway.errors import APIError
from tokenops.gateway.openai.schemas import chat_request
from tokenops.gateway.openai.structured import check_structured

FN = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {}}}}}


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"response_format": "json"}, "response_format", "must be an object"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "is required"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
            "response_format.json_schema.name",
            "1-64 characters",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"minLength": -1}}}},
            "response_format.json_schema.schema",
            "not a valid JSON Schema",
        ),
        ({"tools": {"f": 1}}, "tools", "must be a list"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type", 'must be "function"'),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name", "1-64"),
        ({"tools": [FN, FN]}, "tools[1].function.name", "defined twice"),
        (
            {"tools": [{"type": "function", "function": {"name": "g", "parameters": {"type": "string"}}}]},
            "tools[0].function.parameters",
            "must describe an object",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "g", "parameters": []}}]},
            "tools[0].function.parameters",
            "JSON Schema object",
        ),
        ({"tools": [FN], "tool_choice": "always"}, "tool_choice", "none, auto, required"),
        (
            {"tools": [FN], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice",
            "not in tools (f)",
        ),
        ({"tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "none defined"),
        ({"tools": [FN], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ],
)
def test_bad_structured_fields_are_400s_naming_the_field(body, param, words):
    with pytest.raises(APIError) as e:
        check_structured(body)
    assert e.value.status == 400 and e.value.param == param and words in e.value.message


def test_good_requests_pass_and_keep_their_fields():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [FN],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
        },
    }
    request = chat_request(body, 16)
    for key in ("tools", "tool_choice", "parallel_tool_calls", "response_format"):
        assert request.body[key] == body[key]
    check_structured({"tool_choice": "none"})
    check_structured({"response_format": {"type": "text"}})
