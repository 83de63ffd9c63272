"""Structured outputs and tool calling for the bundled engine (the ``local`` backend).

The policy that maps an OpenAI chat request onto the engine's mechanisms:

- ``tools`` (unless ``tool_choice`` is ``"none"``) reach the chat template as the
  ``tools`` variable Hugging Face templates read, and the model's tool-call parser
  (``[[models]] tool_call_parser``) turns what it writes into ``tool_calls``.
- ``tool_choice: "required"`` or ``{"type": "function", "function": {"name": ...}}``
  constrains decoding with the parser's grammar: the answer *is* a call (one, or
  several when ``parallel_tool_calls`` is true and the choice is ``"required"``) whose
  ``arguments`` match the function's ``parameters`` schema. ``"auto"`` leaves the model free.
- ``response_format`` ``json_schema`` / ``json_object`` constrains decoding to JSON
  matching the schema (any object for ``json_object``); ``strict`` or not, the schema is
  enforced. A forced tool call takes precedence over ``response_format``; with
  ``tool_choice: "auto"`` the answer is either calls or JSON in the format.
- As xgrammar's strict mode (vLLM's default) does, an object schema with ``properties``
  and no ``additionalProperties``/``patternProperties`` generates only its listed
  properties: the output still validates against the schema as sent, and a model cannot
  wander off into invented keys until it runs out of tokens.

Requests are checked (schemas, tool names) by :mod:`tokenops.gateway.structured` before
they get here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenops.backends.tool_parsers import ToolCallParser, ToolCallStream, get_tool_call_parser
from tokenops.types import OutputFields


@dataclass(slots=True)
class StructuredPlan:
    """What one chat request needs: template variables, a grammar, a tool-call parser."""

    template_kwargs: dict[str, Any]
    grammar: Any = None  # tokenops.engine.grammar.GrammarSpec
    parser: ToolCallParser | None = None
    #: The grammar writes any call (forced, or auto beside a response_format): valid as it grows.
    is_call_constrained: bool = False

    def new_stream(self) -> ToolCallStream | None:
        return self.parser.stream(self.is_call_constrained) if self.parser is not None else None


def plan_request(fields: OutputFields, parser_name: str) -> StructuredPlan:
    """The plan for the output fields of a validated chat request."""
    from tokenops.engine.grammar import GrammarSpec

    plan = StructuredPlan(template_kwargs={})
    tools = fields.tools or []
    choice = fields.tool_choice if fields.tool_choice is not None else ("auto" if tools else "none")
    if tools and choice != "none":
        plan.template_kwargs["tools"] = tools
        plan.parser = get_tool_call_parser(parser_name)
        functions = [t["function"] for t in tools if t.get("type", "function") == "function"]
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name")
            functions = [f for f in functions if f.get("name") == wanted]
            functions = _closed_functions(functions)
            plan.grammar = GrammarSpec(
                "lark", plan.parser.grammar(functions, parallel=False), plan.parser.shortest(functions)
            )
            plan.is_call_constrained = True
        elif choice == "required":
            parallel = fields.parallel_tool_calls is True
            functions = _closed_functions(functions)
            plan.grammar = GrammarSpec(
                "lark", plan.parser.grammar(functions, parallel=parallel), plan.parser.shortest(functions)
            )
            plan.is_call_constrained = True
        elif (answer := response_format_grammar(fields.response_format)) is not None:
            # auto beside a response_format: calls, or the answer in the format
            functions = _closed_functions(functions)
            schema = json.loads(answer.source)
            if isinstance(schema, dict):
                schema = {**schema, "x-guidance": {"whitespace_flexible": False}}
            grammar = plan.parser.grammar(
                functions, parallel=fields.parallel_tool_calls is True, answer=f"%json {json.dumps(schema)}"
            )
            plan.grammar = GrammarSpec("lark", grammar, max(plan.parser.shortest(functions), answer.shortest, key=len))
            plan.is_call_constrained = True
    if plan.grammar is None:
        plan.grammar = response_format_grammar(fields.response_format)
    return plan


def response_format_grammar(response_format: Any) -> Any:
    """The grammar of an OpenAI ``response_format`` (None for ``text`` or none)."""
    from tokenops.engine.grammar import GrammarSpec

    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return GrammarSpec.json_schema({"type": "object"})
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return GrammarSpec.json_schema(close_objects(schema) if schema is not None else {"type": "object"})
    return None


def _closed_functions(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**f, "parameters": close_objects(f["parameters"])} if "parameters" in f else f for f in functions]


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def close_objects(schema: Any, *, in_all_of: bool = False) -> Any:
    """A copy of ``schema`` where each object schema that lists ``properties`` and says
    nothing of other keys gets ``additionalProperties: false`` (not inside ``allOf``,
    whose branches describe one object together)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: close_objects(v) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [close_objects(v) for v in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [close_objects(v, in_all_of=True) for v in out["allOf"]]
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = close_objects(out[key])
    is_open = not any(k in out for k in ("additionalProperties", "patternProperties", "unevaluatedProperties"))
    if "properties" in out and is_open and not in_all_of:
        out["additionalProperties"] = False
    return out
