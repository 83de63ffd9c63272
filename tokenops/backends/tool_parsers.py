"""Tool-call parsers for the bundled engine: generated text -> OpenAI ``tool_calls``.

A parser knows one model family's tool-call format, like vLLM's ``--tool-call-parser``,
chosen per model with ``[[models]] tool_call_parser = "hermes"``. It gives

- :meth:`ToolCallParser.grammar` — a Lark grammar (llguidance dialect) that produces
  exactly its format, with each call's JSON constrained to the function's ``parameters``
  schema: used when ``tool_choice`` is ``"required"`` or names a function;
- :meth:`ToolCallParser.stream` — a :class:`ToolCallStream` that turns text deltas into
  content pieces and OpenAI tool-call delta pieces (``index``, ``id``, ``type``,
  ``function.name``, then ``function.arguments`` fragments).

``hermes`` (Hermes 2 Pro, Qwen 2.5/3, the demo models): each call is
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, whitespace around the JSON allowed.
A call whose JSON does not parse, or a free one (``tool_choice`` auto) of a function not offered or
with arguments its schema refuses, is left in the content. A free answer that is only JSON calls,
bare or fenced as Qwen2.5-Coder writes them, is read as calls (:class:`FreeHermesStream`)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from tokenops.backends.tool_arguments import Call, arguments_match, call_of, json_values

_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS = re.compile(r'"arguments"\s*:\s*')


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallStream:
    """Splits one choice's streamed text into content and tool-call pieces.

    ``push(text)`` and, at the end, ``finish()`` return ``(content, pieces)``. Text that
    may be the start of an opening tag is held back until it is known. A constrained
    call (``is_constrained``: its JSON is valid by construction) streams its name as
    soon as it is complete and its arguments as they grow; a free one is checked at
    its closing tag and sent whole (or returned to the content if it does not parse).
    """

    def __init__(self, open_tag: str, close_tag: str, is_constrained: bool) -> None:
        self.open_tag, self.close_tag = open_tag, close_tag
        self.is_constrained = is_constrained
        self.num_calls = 0
        self._buf = ""  # text not yet sent (content tail or the current call's body)
        self._in_call = False
        self._call_id = ""
        self._sent_name = False
        self._sent_args = 0
        self._blank = ""  # whitespace-only content, held: around calls it is dropped
        self.offered: dict[str, Any] | None = None  # name -> ``parameters`` of the offered functions
        #: The confidence gate (tokenops/backends/tool_confidence.py; name, arguments, valid -> passes): a
        #: free call it refuses is dropped with all that follows (``gated``); the backend answers again in text.
        self.gate: Callable[[str, str, bool], bool] | None = None
        self.gated = False

    def is_known(self, name: str, arguments: str) -> bool:
        """Whether a free call is a call: of an offered function, with arguments valid for its schema
        (else it stays text: a model that invents a tool, or its arguments, answers in text)."""
        offered = None if self.is_constrained else self.offered
        valid = offered is None or (name in offered and arguments_match(arguments, offered[name]))
        # with the gate on, an invalid free call is answered again in text too, not left as raw JSON
        self.gated = self.gate is not None and not self.gate(name, arguments, valid)
        return valid and not self.gated

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self.gated:
            return "", []
        content, pieces = self._push(text)
        return self._hold_blank(content), pieces

    def _hold_blank(self, content: str) -> str:
        if not content:
            return ""
        if not content.strip():
            self._blank += content
            return ""
        content, self._blank = self._blank + content, ""
        return content

    def _push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        self._buf += text
        content, pieces = [], []
        while True:
            if not self._in_call:
                at = self._buf.find(self.open_tag)
                if at < 0:
                    keep = _partial_suffix(self._buf, self.open_tag)
                    content.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                content.append(self._buf[:at])
                self._buf = self._buf[at + len(self.open_tag) :]
                self._in_call, self._call_id, self._sent_name, self._sent_args = True, new_call_id(), False, 0
                continue
            end = self._buf.find(self.close_tag)
            if end < 0:
                if self.is_constrained and self.gate is None:  # less what may be the start of the closing tag
                    pieces += self._stream_partial(
                        self._buf[: len(self._buf) - _partial_suffix(self._buf, self.close_tag)]
                    )
                break
            body, self._buf = self._buf[:end], self._buf[end + len(self.close_tag) :]
            self._in_call = False
            call = _parse_call(body)
            if call is None or not self.is_known(*call):  # not a call after all: it stays text
                if self.gated:
                    self._buf = ""
                    break
                content.append(self.open_tag + body + self.close_tag)
                continue
            pieces += self._finish_call(body, call)
        return "".join(content), pieces

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """The end of the text: an unclosed call is returned as content (if nothing of it
        was streamed as a call) or completed from what arrived."""
        if self.gated:
            return "", []
        content, pieces = self._finish()
        content = self._hold_blank(content)
        if not self.num_calls:
            content, self._blank = content + self._blank, ""
        return content, pieces

    def _finish(self) -> tuple[str, list[dict[str, Any]]]:
        rest, self._buf = self._buf, ""
        if not self._in_call:
            return rest, []
        self._in_call = False
        call = _parse_call(rest)
        if call is not None and self.is_known(*call):
            return "", self._finish_call(rest, call)
        if self.gated:
            return "", []
        if self._sent_name:  # a constrained call cut short (max_tokens): keep what was sent
            self.num_calls += 1
            return "", []
        return self.open_tag + rest, []

    def _header(self, name: str) -> dict[str, Any]:
        self._sent_name = True
        return {
            "index": self.num_calls,
            "id": self._call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }

    def _stream_partial(self, body: str) -> list[dict[str, Any]]:
        pieces = []
        if not self._sent_name:
            m = _NAME.search(body)
            if m is None or not _ARGS.search(body, m.end()):
                return []
            pieces.append(self._header(json.loads(f'"{m.group(1)}"')))
        name = _NAME.search(body)
        args_at = _ARGS.search(body, name.end()) if name is not None else None
        assert args_at is not None  # both were in the buffer before the header was sent, and it only grows
        args = body[args_at.end() :]
        # a trailing "}" may close the call object itself: hold it (and whitespace) back
        safe = args.rstrip()
        if safe.endswith("}"):
            safe = safe[:-1].rstrip()
        if len(safe) > self._sent_args:
            pieces.append({"index": self.num_calls, "function": {"arguments": safe[self._sent_args :]}})
            self._sent_args = len(safe)
        return pieces

    def _finish_call(self, body: str, call: tuple[str, str]) -> list[dict[str, Any]]:
        name, arguments = call
        pieces = [] if self._sent_name else [self._header(name)]
        # what was streamed is a prefix of ``arguments``: the text so far less a trailing "}"
        if len(arguments) > self._sent_args:
            pieces.append({"index": self.num_calls, "function": {"arguments": arguments[self._sent_args :]}})
        self.num_calls += 1
        return pieces


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _parse_call(body: str) -> tuple[str, str] | None:
    """``(name, arguments JSON text)`` of a call body, or None when it is not one.
    The arguments text is the model's own, as generated (when it is an object)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, dict):
        return None
    m = _NAME.search(body)
    a = _ARGS.search(body, m.end()) if m else None
    if a is not None:
        raw = body[a.end() :].rstrip()
        if raw.endswith("}"):
            raw = raw[:-1].rstrip()  # the call object's own closing brace
            try:
                if json.loads(raw) == args:
                    return obj["name"], raw
            except ValueError:
                pass
    return obj["name"], json.dumps(args, ensure_ascii=False)


class LeadingCallsStream(ToolCallStream):
    """A :class:`ToolCallStream` for a format whose calls are the answer's whole text:
    ``openers`` are how such an answer can start, ``parse`` reads the calls (None: not calls)."""

    def __init__(self, openers: tuple[str, ...], parse: Callable[[str], list[Call] | None]) -> None:
        super().__init__(openers[0], "", is_constrained=False)
        self.openers = openers
        self.parse = parse
        self._is_content = False

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self._is_content:
            return text, []
        self._buf += text
        head = self._buf.lstrip()
        if not head or any(head.startswith(o) or o.startswith(head) for o in self.openers):
            return "", []  # may be a call: held until the end
        self._is_content = True
        content, self._buf = self._buf, ""
        return content, []

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        text, self._buf = self._buf, ""
        if self._is_content or not text.strip():
            return text, []
        calls = self.parse(text)
        if calls is None or not all(self.is_known(*c) for c in calls):
            return ("", []) if self.gated else (text, [])
        pieces = []
        for name, arguments in calls:
            fn = {"name": name, "arguments": arguments}
            pieces.append({"index": self.num_calls, "id": new_call_id(), "type": "function", "function": fn})
            self.num_calls += 1
        return "", pieces


#: How a free Hermes-format answer may hold its calls other than in ``<tool_call>`` tags: Qwen2.5-Coder
#: writes them as a fenced JSON block (`````json {"name": ..., "arguments": ...} `````), or bare.
_FENCE = "```"


def parse_fenced_calls(text: str) -> list[Call] | None:
    """The calls of an answer that is only call objects (or arrays of them), bare or in fenced
    code blocks (`````json``); None when anything else is in it."""
    body = re.sub(r"```(?:json)?", " ", text)
    items: list[Any] = []
    for value in json_values(body, ",") or []:
        items += value if isinstance(value, list) else [value]
    calls = [call_of(v, ("arguments", "parameters")) for v in items]
    return [c for c in calls if c is not None] if calls and None not in calls else None


class FreeHermesStream(ToolCallStream):
    """A free (unconstrained) answer in the ``hermes`` format: calls in ``<tool_call>`` tags, or an
    answer that starts as a fenced or bare JSON call (:func:`parse_fenced_calls`, held to the end)."""

    def __init__(self) -> None:
        super().__init__(HermesToolCallParser.open_tag, HermesToolCallParser.close_tag, is_constrained=False)
        self._head = ""  # the start of the answer, until it shows which way it goes
        self._inner: ToolCallStream | None = None

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self._inner is None:
            self._head += text
            head = self._head.lstrip()
            if not head or _FENCE.startswith(head) or self.open_tag.startswith(head):
                return "", []  # too short to tell
            is_json = head.startswith((_FENCE, "{", "["))
            self._inner = (
                LeadingCallsStream((_FENCE, "{", "["), parse_fenced_calls)
                if is_json
                else ToolCallStream(self.open_tag, self.close_tag, is_constrained=False)
            )
            self._inner.offered, self._inner.gate = self.offered, self.gate
            text, self._head = self._head, ""
        content, pieces = self._inner.push(text)
        self.num_calls, self.gated = self._inner.num_calls, self._inner.gated
        return content, pieces

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        if self._inner is None:
            self._inner = ToolCallStream(self.open_tag, self.close_tag, is_constrained=False)
            self._inner.offered, self._inner.gate = self.offered, self.gate
            head, self._head = self._head, ""
            content, pieces = self._inner.push(head)
        else:
            content, pieces = "", []
        more, more_pieces = self._inner.finish()
        self.num_calls, self.gated = self._inner.num_calls, self._inner.gated
        return ("", []) if self.gated else (content + more, pieces + more_pieces)


class ToolCallParser:
    """A named tool-call format (see the module docstring)."""

    name = ""

    def grammar(self, functions: list[dict[str, Any]], parallel: bool, answer: str | None = None) -> str:
        """A Lark grammar of calls of ``functions``; with ``answer`` (a Lark expression),
        that answer instead of calls is allowed too."""
        raise NotImplementedError

    def stream(self, is_constrained: bool) -> ToolCallStream:
        raise NotImplementedError

    def shortest(self, functions: list[dict[str, Any]]) -> str:
        """A short text of :meth:`grammar` ("" when unknown)."""
        return ""


class HermesToolCallParser(ToolCallParser):
    name = "hermes"
    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def grammar(self, functions: list[dict[str, Any]], parallel: bool, answer: str | None = None) -> str:
        """One call (or several when ``parallel``) of ``functions`` (OpenAI ``function``
        objects), each ``<tool_call>\\n{"name":NAME,"arguments":ARGS}\\n</tool_call>``,
        or ``answer`` when given.

        The call's envelope is literal text and ``ARGS`` its own ``%json`` with the
        function's ``parameters`` as the root schema: pointers such as ``#/$defs/Item``
        (every pydantic model with a nested model) and ``#`` (recursive schemas) resolve
        against the parameters as the client wrote them, with no rewriting."""
        alternatives = []
        for fn in functions:
            params = fn.get("parameters") or {"type": "object", "properties": {}}
            if isinstance(params, dict):
                params = {**params, "x-guidance": {"whitespace_flexible": False}}
            head = json.dumps(f'{{"name":{json.dumps(fn["name"])},"arguments":')
            alternatives.append(f'{head} %json {json.dumps(params)} "}}"')
        call = f'"{self.open_tag}\\n" ( {" | ".join(f"( {a} )" for a in alternatives)} ) "\\n{self.close_tag}"'
        more = ' ("\\n" call)*' if parallel else ""
        other = f" | {answer}" if answer else ""
        return f"start: call{more}{other}\ncall: {call}\n"

    def stream(self, is_constrained: bool) -> ToolCallStream:
        return ToolCallStream(self.open_tag, self.close_tag, is_constrained) if is_constrained else FreeHermesStream()

    def shortest(self, functions: list[dict[str, Any]]) -> str:
        """The longest of the functions' shortest calls (for the budget-aware close)."""
        from tokenops.engine.sampling.json_shortest import shortest_json

        calls = [
            f'{self.open_tag}\n{{"name":{json.dumps(fn["name"])},"arguments":'
            f"{shortest_json(fn.get('parameters') or {})}}}\n{self.close_tag}"
            for fn in functions
        ]
        return max(calls, key=len, default="")


_PARSERS: dict[str, Callable[[], ToolCallParser]] = {"hermes": HermesToolCallParser}


def get_tool_call_parser(name: str) -> ToolCallParser:
    """The parser registered as ``name``; ValueError naming the known ones otherwise."""
    factory = _PARSERS.get(name)
    if factory is None:
        raise ValueError(f"unknown tool_call_parser {name!r}; known: {', '.join(sorted(_PARSERS))}")
    return factory()


def register_tool_call_parser(name: str, factory: Callable[[], ToolCallParser]) -> None:
    _PARSERS[name] = factory
