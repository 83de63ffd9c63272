"""The ``generic`` tool-call parser: calls for a model whose chat template knows no tools.

The format is :mod:`tokenops.backends.tool_format`'s: each call
``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>``, several one per line, and a
reply without a call ``<tool_call>{"name": "text"}</tool_call>`` then plain text. The
grammar (llguidance Lark) admits, as the request asks:

- ``tool_choice: "auto"``: complete calls, or the ``text`` preamble and a free text reply
  (or, beside a ``response_format``, the answer in that format);
- ``"required"``: calls only; a named function: one call of it;
- with ``parallel_tool_calls``: one or more complete calls and then only the end of the
  turn; without: exactly one.

Each call's ``arguments`` is its own ``%json`` with the function's ``parameters`` as the
root schema (as the ``hermes`` grammar does), so every call is valid JSON for its schema;
the budget-aware close (:func:`tokenops.engine.sampling.grammar.steer_to_close`) ends the turn
rather than start a call that cannot finish.
"""

from __future__ import annotations

import json
from typing import Any

from tokenops.backends.tool_format import NO_CALL_NAME
from tokenops.backends.tool_parsers import ToolCallParser, ToolCallStream, register_tool_call_parser

#: ``answer`` for :meth:`GenericToolCallParser.grammar`: a free text reply.
TEXT_REPLY = "TEXT"
OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
#: What a reply without a call starts with (never shown to the client).
NO_CALL = f'{OPEN_TAG}{{"name": "{NO_CALL_NAME}"}}{CLOSE_TAG}'
#: Arguments are written as the prompt shows JSON (and as ``json.dumps`` writes it): ``", "``, ``": "``.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a Lark string literal


class GenericToolCallStream(ToolCallStream):
    """:class:`ToolCallStream` for the generic format: the ``text`` preamble is dropped and
    everything after it is the reply's content (leading whitespace dropped)."""

    def __init__(self, is_constrained: bool) -> None:
        super().__init__(OPEN_TAG, CLOSE_TAG, is_constrained)
        self.is_reply = False
        self._reply_rest = ""
        self._reply_started = False

    def is_known(self, name: str, arguments: str) -> bool:
        return name == NO_CALL_NAME or super().is_known(name, arguments)  # the reply preamble is never gated

    def _push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self.is_reply:
            return self._reply_text(text), []
        content, pieces = super()._push(text)
        if self.is_reply:  # the preamble closed in this piece: what followed it is the reply
            rest, self._reply_rest = self._reply_rest, ""
            content += self._reply_text(rest)
        return content, pieces

    def _reply_text(self, text: str) -> str:
        if not self._reply_started:
            text = text.lstrip()
            self._reply_started = bool(text)
        return text

    def _finish_call(self, body: str, call: tuple[str, str]) -> list[dict[str, Any]]:
        if call[0] == NO_CALL_NAME and not self._sent_name and not self.num_calls:
            self.is_reply = True
            self._reply_rest, self._buf = self._buf, ""
            return []
        return super()._finish_call(body, call)


class GenericToolCallParser(ToolCallParser):
    name = "generic"
    open_tag, close_tag = OPEN_TAG, CLOSE_TAG

    def grammar(self, functions: list[dict[str, Any]], parallel: bool, answer: str | None = None) -> str:
        """Calls of ``functions`` (one, or one or more when ``parallel``), or, with ``answer`` (a
        Lark expression, or :data:`TEXT_REPLY`), the ``text`` preamble followed by that answer."""
        alternatives = []
        for fn in functions:
            params = fn.get("parameters") or {"type": "object", "properties": {}}
            if isinstance(params, dict):
                params = {**params, "x-guidance": JSON_STYLE}
            head = _lark_string(f'{OPEN_TAG}{{"name": {json.dumps(fn["name"])}, "arguments": ')
            alternatives.append(f"{head} %json {json.dumps(params)} {_lark_string('}' + CLOSE_TAG)}")
        rules = [f"call: {' | '.join(f'( {a} )' for a in alternatives)}"] if alternatives else []
        branches = [('call ("\\n" call)*' if parallel else "call")] if alternatives else []
        if answer is not None:
            branches.append(f"{_lark_string(NO_CALL)} {answer}")
        start = " | ".join(branches)
        if answer == TEXT_REPLY:
            rules.append(f"{TEXT_REPLY}: /\\s*\\S(.|\\n)*/")  # not empty: a reply says something
        return f"start: {start}\n" + "\n".join(rules) + "\n"

    def stream(self, is_constrained: bool) -> ToolCallStream:
        return GenericToolCallStream(is_constrained)

    def shortest(self, functions: list[dict[str, Any]]) -> str:
        """The longest of the functions' shortest calls (for the budget-aware close)."""
        from tokenops.engine.sampling.json_shortest import shortest_json

        calls = [
            f'{OPEN_TAG}{{"name": {json.dumps(fn["name"])}, "arguments": {shortest_json(fn.get("parameters") or {})}}}'
            f"{CLOSE_TAG}"
            for fn in functions
        ]
        return max(calls, key=len, default="")


register_tool_call_parser("generic", GenericToolCallParser)
