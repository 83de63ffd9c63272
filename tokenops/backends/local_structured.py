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
- A model whose chat template renders no tools (``tool_call_parser`` is then ``generic``, set
  at load) gets them in a system message (:mod:`tokenops.backends.tool_format`), and with
  ``tool_choice: "auto"`` a grammar that admits calls or a text reply
  (:mod:`tokenops.backends.generic_tool_calls`): the model decides inside the call envelope.

Requests are checked (schemas, tool names) by :mod:`tokenops.gateway.openai.structured` before
they get here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenops.backends.generic_tool_calls import TEXT_REPLY, GenericToolCallParser
from tokenops.backends.json_tool_calls import JSON_CALL_PARSERS, native_messages
from tokenops.backends.tool_format import NO_CALL_NAME, answered_calls, generic_messages
from tokenops.backends.tool_parsers import ToolCallParser, ToolCallStream, get_tool_call_parser
from tokenops.types import OutputFields


@dataclass(slots=True)
class StructuredPlan:
    """What one chat request needs: template variables, a grammar, a tool-call parser."""

    template_kwargs: dict[str, Any]
    grammar: Any = None  # tokenops.engine.sampling.grammar.GrammarSpec
    parser: ToolCallParser | None = None
    #: The grammar writes any call (forced, or auto beside a response_format): valid as it grows.
    is_call_constrained: bool = False
    #: The tools the generic format writes into the prompt (tokenops/backends/tool_format.py), or None.
    generic_tools: list[dict[str, Any]] | None = None
    #: The model's tool-call parser (its name): how earlier calls reach the template.
    parser_name: str = ""
    #: The functions the request offers (name -> ``parameters``): a free call of another one, or
    #: with arguments its schema refuses, stays text.
    offered: dict[str, Any] | None = None
    #: ``tool_choice`` auto with no ``response_format``: the model chose to call, so its calls go
    #: through the confidence gate (tokenops/backends/tool_confidence.py); forced calls never do.
    is_free: bool = False

    def new_stream(self) -> ToolCallStream | None:
        if self.parser is None:
            return None
        stream = self.parser.stream(self.is_call_constrained)
        stream.offered = self.offered
        return stream

    def prompt_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` as the chat template gets them (the generic format adds the tools; Llama 3.x
        and Mistral templates take earlier calls' arguments as objects)."""
        if self.generic_tools:
            return generic_messages(messages, self.generic_tools)
        return native_messages(messages, self.parser_name) if self.parser_name in JSON_CALL_PARSERS else messages


def plan_request(
    fields: OutputFields, parser_name: str, messages: list[dict[str, Any]] | None = None
) -> StructuredPlan:
    """The plan for the output fields of a validated chat request (``parser_name``: the model's
    tool-call parser; ``generic`` for a model whose template knows no tools; ``messages``: the
    conversation, which the generic format's ``auto`` reads for the calls just answered)."""
    from tokenops.engine.sampling.grammar import GrammarError, GrammarSpec

    plan = StructuredPlan(template_kwargs={}, parser_name=parser_name)
    tools = fields.tools or []
    choice = fields.tool_choice if fields.tool_choice is not None else ("auto" if tools else "none")
    if not tools or choice == "none":
        plan.grammar = response_format_grammar(fields.response_format)
        return plan
    is_generic = parser_name == GenericToolCallParser.name
    plan.parser = get_tool_call_parser(parser_name)
    if is_generic:
        if any((t.get("function") or {}).get("name") == NO_CALL_NAME for t in tools):
            raise GrammarError(
                f"this model's chat template has no tool support, so its tools use the generic format, where the "
                f"name {NO_CALL_NAME!r} means no call: rename that tool"
            )
        plan.generic_tools = tools
    else:
        plan.template_kwargs["tools"] = tools
    functions = [t["function"] for t in tools if t.get("type", "function") == "function"]
    plan.offered = {str(f.get("name")): f.get("parameters") for f in functions}
    parallel = fields.parallel_tool_calls is True
    answer: str | None = None
    shortest = ""
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        functions, parallel = [f for f in functions if f.get("name") == wanted], False
    elif choice != "required":  # auto: calls, or the answer in the response_format, or (generic) text
        if (answer_spec := response_format_grammar(fields.response_format)) is not None:
            schema = json.loads(answer_spec.source)
            if isinstance(schema, dict):
                schema = {**schema, "x-guidance": {"whitespace_flexible": False}}
            answer, shortest = f"%json {json.dumps(schema)}", answer_spec.shortest
        elif is_generic:
            answer, plan.is_free = TEXT_REPLY, True
            # a small model calls the tool it just got results from again and again: not offered this turn
            answered = answered_calls(messages or [])
            functions = [f for f in functions if f.get("name") not in answered]
        else:
            plan.is_free = True
            return plan  # a native format with auto: the model is free, its calls parsed
    functions = _closed_functions(functions)
    grammar = plan.parser.grammar(functions, parallel=parallel, answer=answer)
    plan.grammar = GrammarSpec("lark", grammar, max(plan.parser.shortest(functions), shortest, key=len))
    plan.is_call_constrained = True
    return plan


def response_format_grammar(response_format: Any) -> Any:
    """The grammar of an OpenAI ``response_format`` (None for ``text`` or none)."""
    from tokenops.engine.sampling.grammar import GrammarSpec

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
