"""Tool-call parsers (tokenops/backends/tool_parsers.py) and the local backend's plan
for structured requests (tokenops/backends/local_structured.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenops.backends.base import merge_tool_calls
from tokenops.backends.local_structured import close_objects, plan_request
from tokenops.types import OutputFields
from tokenops.backends.tool_parsers import get_tool_call_parser

DEMO = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}
ADD = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                     "required": ["a", "b"]}}
TWO_CALLS = ('<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": {"x": 2}}}\n</tool_call>')


def _run(text: str, constrained: bool, piece: int = 3):
    stream = get_tool_call_parser("hermes").stream(constrained)
    content, pieces = [], []
    for i in range(0, len(text), piece):
        c, p = stream.push(text[i:i + piece])
        content.append(c)
        pieces += p
    c, p = stream.finish()
    return "".join(content) + c, pieces, stream


@pytest.mark.parametrize("constrained", [True, False])
@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_hermes_calls_split_from_text_in_any_chunking(constrained, piece):
    content, pieces, stream = _run(TWO_CALLS, constrained, piece)
    calls = merge_tool_calls({}, pieces)
    assert content == "" and stream.num_calls == 2
    assert [calls[k]["function"]["name"] for k in sorted(calls)] == ["get_weather", "add"]
    assert calls[0]["function"]["arguments"] == '{"city":"Paris","unit":"c"}'  # the model's own text
    assert json.loads(calls[1]["function"]["arguments"]) == {"a": 1, "b": {"x": 2}}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls.values())
    first = [p for p in pieces if "id" in p]
    assert [p["index"] for p in first] == [0, 1]  # each call opens once, with its id and name


def test_constrained_arguments_stream_as_they_grow():
    _, pieces, _ = _run(TWO_CALLS.split("\n<tool_call>")[0], True, 1)
    args = [p["function"]["arguments"] for p in pieces if "id" not in p]
    assert len(args) > 5 and "".join(args) == '{"city":"Paris","unit":"c"}'


def test_text_that_is_not_a_call_stays_content():
    content, pieces, stream = _run("Sure. <tool_call>{not json</tool_call> and <tool_", False)
    assert pieces == [] and stream.num_calls == 0
    assert content == "Sure. <tool_call>{not json</tool_call> and <tool_"


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match="known: generic, hermes"):
        get_tool_call_parser("mistral-v9")


def test_forced_call_grammar_accepts_the_format_and_refuses_other_functions():
    from tokenops.engine.sampling.grammar import GrammarCompiler, GrammarSpec
    from tokenops.engine.core.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEMO)
    compiler = GrammarCompiler.for_tokenizer(tok, 8192)
    grammar = get_tool_call_parser("hermes").grammar([WEATHER], parallel=False)
    ok = compiler.compile(GrammarSpec("lark", grammar))
    for t in tok.encode(TWO_CALLS.split("\n<tool_call>")[0], add_special_tokens=False):
        assert ok.accept(t)
    assert ok.is_finished
    bad = compiler.compile(GrammarSpec("lark", grammar))
    ids = tok.encode('<tool_call>\n{"name":"add"', add_special_tokens=False)
    assert not all(bad.accept(t) for t in ids)


def test_plan_follows_tool_choice_and_response_format():
    tools = [{"type": "function", "function": WEATHER}, {"type": "function", "function": ADD}]
    none = plan_request(OutputFields.from_body({"tools": tools, "tool_choice": "none"}), "hermes")
    assert none.template_kwargs == {} and none.parser is None and none.grammar is None
    auto = plan_request(OutputFields.from_body({"tools": tools}), "hermes")
    assert auto.template_kwargs == {"tools": tools} and auto.parser is not None and auto.grammar is None
    named = plan_request(OutputFields.from_body({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "add"}}}), "hermes")
    assert named.is_call_constrained and '\\"name\\":\\"add\\"' in named.grammar.source and "get_weather" not in named.grammar.source
    required = plan_request(OutputFields.from_body({"tools": tools, "tool_choice": "required", "parallel_tool_calls": True}), "hermes")
    assert "get_weather" in required.grammar.source and "call)*" in required.grammar.source
    rf = plan_request(OutputFields.from_body({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": ADD["parameters"]}}}),
                      "hermes")
    assert json.loads(rf.grammar.source)["additionalProperties"] is False
    assert json.loads(plan_request(OutputFields.from_body({"response_format": {"type": "json_object"}}), "hermes").grammar.source) == {
        "type": "object"}


def test_close_objects_only_closes_objects_that_list_properties():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}},
                                               "free": {"type": "object"}, "open": {"properties": {}, "additionalProperties": True}},
              "allOf": [{"properties": {"c": {}}}]}
    out = close_objects(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in out["properties"]["free"]
    assert out["properties"]["open"]["additionalProperties"] is True
    assert "additionalProperties" not in out["allOf"][0]
    assert "additionalProperties" not in schema  # the request's own schema is not changed


def test_an_unknown_parser_in_the_config_is_a_config_error():
    from tokenops.backends.local import LocalBackend
    from tokenops.config import ConfigError, ModelConfig, Settings

    with pytest.raises(ConfigError, match="unknown tool_call_parser 'bogus'; known: generic, hermes"):
        LocalBackend(ModelConfig(name="demo", tool_call_parser="bogus"), Settings())


def test_auto_beside_a_response_format_allows_calls_or_the_json_answer():
    from tokenops.engine.sampling.grammar import GrammarCompiler, GrammarSpec
    from tokenops.engine.core.tokenizer import Tokenizer

    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": ADD["parameters"]}}
    plan = plan_request(OutputFields.from_body({"tools": [{"type": "function", "function": WEATHER}], "response_format": fmt}), "hermes")
    assert plan.is_call_constrained and plan.template_kwargs
    tok = Tokenizer.from_dir(DEMO)
    compiler = GrammarCompiler.for_tokenizer(tok, 8192)
    for text in (TWO_CALLS.split("\n<tool_call>")[0], '{"a":1,"b":2}'):
        matcher = compiler.compile(plan.grammar)
        assert all(matcher.accept(t) for t in tok.encode(text, add_special_tokens=False)), text
    matcher = compiler.compile(plan.grammar)
    assert not all(matcher.accept(t) for t in tok.encode('{"a":1,"c":2}', add_special_tokens=False))


_NODE = {"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
         "required": ["name", "children"], "$defs": {"Node": {"type": "object", "properties": {
             "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
             "required": ["name", "children"]}}}
_LINKED = {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
           "required": ["v", "next"]}


@pytest.mark.parametrize("params, good, bad", [
    (_NODE, '{"name":"a","children":[{"name":"b","children":[]}]}', '{"name":"a","children":[{"name":"b","children":[1]}]}'),
    (_LINKED, '{"v":1,"next":{"v":2,"next":null}}', '{"v":1,"next":{"v":2,"next":3}}'),
])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_forced_calls_resolve_defs_and_recursive_refs_against_the_parameters(params, good, bad, choice):
    """``$ref`` pointers are relative to the function's parameters (as pydantic writes
    them), not to the call envelope the grammar wraps them in."""
    from tokenops.engine.sampling.grammar import GrammarCompiler
    from tokenops.engine.core.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEMO)
    compiler = GrammarCompiler.for_tokenizer(tok, 8192)
    plan = plan_request(OutputFields.from_body({"tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
                         "tool_choice": choice}), "hermes")

    def accepts(arguments: str) -> bool:
        matcher = compiler.compile(plan.grammar)
        text = '<tool_call>\n{"name":"f","arguments":' + arguments + '}\n</tool_call>'
        return all(matcher.accept(t) for t in tok.encode(text, add_special_tokens=False)) and matcher.is_finished

    assert accepts(good)
    assert not accepts(bad)
