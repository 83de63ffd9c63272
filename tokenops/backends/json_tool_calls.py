"""Native tool-call formats that write calls as bare JSON: ``llama3_json`` and ``mistral``.

Chosen per model like ``hermes`` (``[[models]] tool_call_parser``, or found in the chat
template when it is ``auto``: :func:`tokenops.backends.tool_format.native_parser_of`).

- ``llama3_json`` (Llama 3.1/3.2/3.3 templates, whose ``tools`` go into the user message):
  a call is ``{"name": NAME, "parameters": {...}}``, the answer's whole text, perhaps after
  ``<|python_tag|>``; ``"arguments"`` is read as well, and several calls separated by ``;``
  (vLLM's ``llama3_json`` reads the same). The template renders one call per assistant
  turn (two raise "This model only supports single tool-calls at once!"), so the grammar
  of a forced call writes exactly one, parallel calls allowed or not.
- ``mistral`` (Mistral 7B v0.3, Nemo, Small templates): ``[TOOL_CALLS] [{"name": NAME,
  "arguments": {...}}, ...]``; the marker is a special token, which the detokenizer drops,
  so a bare JSON array of calls is read too. The template wants call ids of 9 letters and
  digits: :func:`mistral_call_ids` rewrites the client's ids (``call_...``) to such ids.

Neither format has a closing tag, so a free answer is a call only when its whole text is
one: text that starts as a call could be (``{``, ``[``, or the marker) is held back until
the answer ends and then sent as calls, or as content when it does not parse. Calls come
whole (one piece each), not as argument fragments.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tokenops.backends.tool_parsers import (
    Call,
    LeadingCallsStream,
    ToolCallParser,
    ToolCallStream,
    call_of,
    json_values,
    register_tool_call_parser,
)

#: Arguments written as the templates' ``tojson`` writes them (``", "``, ``": "``).
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
LLAMA_MARKER, MISTRAL_MARKER = "<|python_tag|>", "[TOOL_CALLS]"


def parse_llama3_calls(text: str) -> list[Call] | None:
    """The calls of a ``llama3_json`` answer, or None when it is not only calls."""
    body = text.strip()
    body = body[len(LLAMA_MARKER) :] if body.startswith(LLAMA_MARKER) else body
    values = json_values(body, ";")
    calls = [call_of(v, ("parameters", "arguments")) for v in values or []]
    return [c for c in calls if c is not None] if calls and None not in calls else None


def parse_mistral_calls(text: str) -> list[Call] | None:
    """The calls of a ``mistral`` answer, or None when it is not only calls."""
    body = text.strip()
    body = body[len(MISTRAL_MARKER) :] if body.startswith(MISTRAL_MARKER) else body
    values = json_values(body, "")
    if values is None or len(values) != 1:
        return None
    items = values[0] if isinstance(values[0], list) else [values[0]]
    calls = [call_of(v, ("arguments", "parameters")) for v in items]
    return [c for c in calls if c is not None] if calls and None not in calls else None


def _lark(text: str) -> str:
    return json.dumps(text)  # a JSON string is a Lark string literal


def _call_alternatives(functions: list[dict[str, Any]], args_key: str) -> str:
    """A Lark rule body: one call object of any of ``functions``, its arguments schema-valid."""
    alternatives = []
    for fn in functions:
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if isinstance(params, dict):
            params = {**params, "x-guidance": JSON_STYLE}
        head = _lark(f'{{"name": {json.dumps(fn["name"])}, "{args_key}": ')
        alternatives.append(f'( {head} %json {json.dumps(params)} "}}" )')
    return " | ".join(alternatives)


def _shortest_call(functions: list[dict[str, Any]], args_key: str) -> str:
    from tokenops.engine.sampling.json_shortest import shortest_json

    calls = [
        f'{{"name": {json.dumps(fn["name"])}, "{args_key}": {shortest_json(fn.get("parameters") or {})}}}'
        for fn in functions
    ]
    return max(calls, key=len, default="")


class Llama3JsonToolCallParser(ToolCallParser):
    name = "llama3_json"

    def grammar(self, functions: list[dict[str, Any]], parallel: bool, answer: str | None = None) -> str:
        """One call object (the template renders one per turn), or ``answer`` when given."""
        other = f" | {answer}" if answer else ""
        return f"start: call{other}\ncall: {_call_alternatives(functions, 'parameters')}\n"

    def stream(self, is_constrained: bool) -> ToolCallStream:
        return LeadingCallsStream(("{", LLAMA_MARKER), parse_llama3_calls)

    def shortest(self, functions: list[dict[str, Any]]) -> str:
        return _shortest_call(functions, "parameters")


class MistralToolCallParser(ToolCallParser):
    name = "mistral"

    def grammar(self, functions: list[dict[str, Any]], parallel: bool, answer: str | None = None) -> str:
        """A JSON array of one call (or one or more when ``parallel``), or ``answer`` when given
        (the ``[TOOL_CALLS]`` marker is a special token: the grammar writes the array only)."""
        more = ' (", " call)*' if parallel else ""
        other = f" | {answer}" if answer else ""
        return f'start: "[" call{more} "]"{other}\ncall: {_call_alternatives(functions, "arguments")}\n'

    def stream(self, is_constrained: bool) -> ToolCallStream:
        return LeadingCallsStream(("[", "{", MISTRAL_MARKER), parse_mistral_calls)

    def shortest(self, functions: list[dict[str, Any]]) -> str:
        return f"[{_shortest_call(functions, 'arguments')}]"


def native_messages(messages: list[dict[str, Any]], parser_name: str) -> list[dict[str, Any]]:
    """``messages`` as a ``llama3_json`` or ``mistral`` template wants them: each earlier call's
    ``arguments`` an object, not OpenAI's JSON text (the templates write it with ``tojson``, which
    would quote the text again), and, for ``mistral``, ids as :func:`mistral_call_id` writes them."""
    out = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            message = {**message, "tool_calls": [_decoded_call(c) for c in message["tool_calls"]]}
        out.append(message)
    return mistral_call_ids(out) if parser_name == MistralToolCallParser.name else out


def _decoded_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return call  # what the client sent, as it sent it
    return {**call, "function": {**fn, "arguments": args}}


def mistral_call_id(call_id: str) -> str:
    """A 9-character id of letters and digits (what Mistral templates require) for ``call_id``:
    the same id always maps to the same one, so a call and its result still match."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def mistral_call_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every tool call's ``id`` and tool message's ``tool_call_id`` as
    :func:`mistral_call_id` writes them (other messages unchanged, nothing mutated)."""
    out = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            calls = [{**c, "id": mistral_call_id(str(c.get("id") or ""))} for c in message["tool_calls"]]
            message = {**message, "tool_calls": calls}
        elif message.get("role") == "tool" and message.get("tool_call_id") is not None:
            message = {**message, "tool_call_id": mistral_call_id(str(message["tool_call_id"]))}
        out.append(message)
    return out


#: The parsers whose templates take earlier calls' arguments as objects (:func:`native_messages`).
JSON_CALL_PARSERS = frozenset({Llama3JsonToolCallParser.name, MistralToolCallParser.name})
register_tool_call_parser("llama3_json", Llama3JsonToolCallParser)
register_tool_call_parser("mistral", MistralToolCallParser)
