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
  enforced. A forced tool call takes precedence over ``response_format``.

Requests are checked (schemas, tool names) by :mod:`tokenops.gateway.structured` before
they get here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenops.backends.tool_parsers import ToolCallParser, ToolCallStream, get_tool_call_parser


@dataclass(slots=True)
class StructuredPlan:
    """What one chat request needs: template variables, a grammar, a tool-call parser."""

    template_kwargs: dict[str, Any]
    grammar: Any = None  # tokenops.engine.grammar.GrammarSpec
    parser: ToolCallParser | None = None
    is_forced_call: bool = False

    def new_stream(self) -> ToolCallStream | None:
        return self.parser.stream(self.is_forced_call) if self.parser is not None else None


def plan_request(body: dict[str, Any], parser_name: str) -> StructuredPlan:
    """The plan for a validated chat request body."""
    from tokenops.engine.grammar import GrammarSpec

    plan = StructuredPlan(template_kwargs={})
    tools = body.get("tools") or []
    choice = body.get("tool_choice", "auto" if tools else "none")
    if tools and choice != "none":
        plan.template_kwargs["tools"] = tools
        plan.parser = get_tool_call_parser(parser_name)
        functions = [t["function"] for t in tools if t.get("type", "function") == "function"]
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name")
            functions = [f for f in functions if f.get("name") == wanted]
            plan.grammar = GrammarSpec("lark", plan.parser.grammar(functions, parallel=False))
            plan.is_forced_call = True
        elif choice == "required":
            parallel = body.get("parallel_tool_calls") is True
            plan.grammar = GrammarSpec("lark", plan.parser.grammar(functions, parallel=parallel))
            plan.is_forced_call = True
    if plan.grammar is None:
        plan.grammar = response_format_grammar(body.get("response_format"))
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
        return GrammarSpec.json_schema(schema if schema is not None else {"type": "object"})
    return None

