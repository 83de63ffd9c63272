"""How tools reach a bundled-engine model's prompt: ``native`` or ``generic``.

A model whose chat template renders ``tools`` gets them through its template, and writes
calls in its own format: ``[[models]] tool_call_parser``, or with its default ``auto`` the
format the template renders an earlier call in (:func:`native_parser_of`: ``hermes`` for
Hermes and Qwen 2.5/3 templates, ``llama3_json`` for Llama 3.x, ``mistral`` for Mistral
7B v0.3/Nemo/Small). A model whose template ignores them (SmolLM2, the fallback template),
or writes calls in a format no parser reads (Qwen3-Coder's XML, Mistral's ``[ARGS]``), gets
the **generic** format instead: decided once at load by rendering the template with and
without a dummy tool (:meth:`tokenops.engine.core.tokenizer.Tokenizer.renders_tools`).

The generic format, the one documented way (docs/serve.md, "Tools on every model"):

- The tools go into a system message (the client's own system message, if any, comes
  first, then a blank line), as :func:`generic_system_prompt` writes it: one JSON object
  per tool (``name``, ``description``, ``parameters``) between ``<tools>`` and
  ``</tools>``, and how to answer.
- A call is ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>``; several calls
  follow each other, one per line. An answer without a call (``tool_choice: "auto"``)
  starts with ``<tool_call>{"name": "text"}</tool_call>`` and goes on in plain text: the
  model decides *inside* the call envelope, where even a 135M model picks the tool a
  request needs, and that preamble is never shown to the client.
- Earlier turns are rendered the same way: an assistant message's ``tool_calls`` become
  its ``<tool_call>`` lines, and ``tool`` messages become one user message, a line
  ``NAME returned: RESULT`` per result and then "Answer my question with this result."
  (:data:`RESULTS_ASK`), so templates that know only user/assistant/system render them and
  a small model answers from the result rather than about it.
- With ``tool_choice: "auto"``, the tools whose results end the conversation are not
  offered again in that turn (a small model calls the same tool again and again): the
  model answers from the results, or calls another tool.

The grammar that constrains the answer is the generic parser's
(:mod:`tokenops.backends.generic_tool_calls`).
"""

from __future__ import annotations

import json
import re
from typing import Any

NATIVE, GENERIC = "native", "generic"
#: The name a generic answer "calls" to say that no tool is needed; then the answer is text.
#: (measured on SmolLM2-135M with tests/benchmarks/tool_calls.py: "text" 90% right on irrelevant
#: requests and 64% on obvious ones over 200 cases; "none" 40% and 60% over 40)
NO_CALL_NAME = "text"
#: What follows a turn's tool results: measured on SmolLM2-135M through serve (8 weather and sum
#: conversations, greedy), 7 of 8 answers then quote the result, against 1 of 8 after the results
#: alone in ``<tool_result name=...>`` tags (the answers described the function instead).
RESULTS_ASK = "Answer my question with {these}."


#: ``[[models]] tool_call_parser`` default: the parser whose format the chat template writes calls in.
AUTO = "auto"
_PROBE = "tokenops_probe_tool"
#: How each native parser's calls look where a template renders an earlier call of :data:`_PROBE`.
_RENDERED_CALLS = {
    "hermes": re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*"' + _PROBE + '"'),
    "mistral": re.compile(r'\[TOOL_CALLS\]\s*\[\s*\{\s*"name"\s*:\s*"' + _PROBE + '"'),
    "llama3_json": re.compile(r'\{\s*"name"\s*:\s*"' + _PROBE + r'"\s*,\s*"parameters"\s*:'),
}


def tool_format_of(tokenizer: Any, parser: str = AUTO) -> tuple[str, str]:
    """``(format, parser name)`` for a model: ``native`` and its parser when the chat template renders
    tools and the parser is configured (``parser`` not :data:`AUTO`) or found by :func:`native_parser_of`;
    else ``generic`` (no tools in the template, or calls in a format no parser reads)."""
    renders = getattr(tokenizer, "renders_tools", None)
    try:
        is_rendered = renders is not None and renders()
    except Exception:  # noqa: BLE001 (a template that fails on a tool, not only through raise_exception)
        is_rendered = False
    if not is_rendered:
        return GENERIC, GENERIC
    found = native_parser_of(tokenizer) if parser == AUTO else parser
    return (NATIVE, found) if found is not None else (GENERIC, GENERIC)


def native_parser_of(tokenizer: Any) -> str | None:
    """The parser of the format the chat template writes an earlier call in (``hermes``, ``mistral``,
    ``llama3_json``), or None: the format a model was trained to write calls in is the one its template
    renders them in, whatever the family is called."""
    tool = {
        "type": "function",
        "function": {
            "name": _PROBE,
            "description": "A probe.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }
    call = {"id": "probe0001", "type": "function", "function": {"name": _PROBE, "arguments": {"x": "y"}}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "probe0001", "name": _PROBE, "content": "ok"},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tools=[tool])
    except Exception:  # noqa: BLE001 (a template that cannot render a call: no native calls to read)
        return None
    return next((name for name, shape in _RENDERED_CALLS.items() if shape.search(text)), None)


def generic_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The system text that lists ``tools`` (OpenAI ``{"type": "function", "function": ...}``)."""
    lines = []
    for tool in tools:
        fn = tool.get("function") or {}
        entry = {"name": fn.get("name"), "description": fn.get("description") or ""}
        entry["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
        lines.append(json.dumps(entry, ensure_ascii=False))
    listing = "\n".join(lines)
    return (
        f"You can call these functions:\n<tools>\n{listing}\n</tools>\n"
        "Reply with the function calls that answer the user's request, each as "
        '<tool_call>{"name": "function name", "arguments": {...}}</tool_call>.\n'
        f'When no function fits the request, call "{NO_CALL_NAME}" and answer in plain text.'
    )


def generic_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` (content already plain text) as the generic format renders them."""
    names = {
        c.get("id"): (c.get("function") or {}).get("name")
        for m in messages
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    }
    system = generic_system_prompt(tools)
    if messages and messages[0].get("role") in ("system", "developer"):
        first = messages[0].get("content") or ""
        system = f"{first}\n\n{system}" if first else system
        messages = messages[1:]
    out: list[dict[str, Any]] = [{"role": "system", "content": system}]
    results: list[str] = []  # the tool results of the run of ``tool`` messages being read
    for message in messages:
        role = message.get("role")
        if role == "tool":
            name = message.get("name") or names.get(message.get("tool_call_id")) or "tool"
            results.append(f"{name} returned: {message.get('content') or ''}")
            continue
        _flush_results(out, results)
        if role == "assistant" and message.get("tool_calls"):
            calls = [call_text(c.get("function") or {}) for c in message["tool_calls"]]
            text = message.get("content") or ""
            out.append({"role": "assistant", "content": "\n".join(([text] if text else []) + calls)})
            continue
        out.append(message)
    _flush_results(out, results)
    return out


def _flush_results(out: list[dict[str, Any]], results: list[str]) -> None:
    """Consecutive tool results as one user message that asks for the answer from them."""
    if results:
        these = "this result" if len(results) == 1 else "these results"
        out.append({"role": "user", "content": "\n".join(results) + f"\n{RESULTS_ASK.format(these=these)}"})
        results.clear()


def answered_calls(messages: list[dict[str, Any]]) -> set[str]:
    """Names of the tools whose results end ``messages`` (the last assistant turn's calls)."""
    if not messages or messages[-1].get("role") != "tool":
        return set()
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return {str((c.get("function") or {}).get("name")) for c in message.get("tool_calls") or []}
    return set()


def call_text(function: dict[str, Any]) -> str:
    """One call in the generic format (``function``: OpenAI ``{"name", "arguments"}``, arguments as text)."""
    args = function.get("arguments") or "{}"
    try:
        args = json.dumps(json.loads(args), ensure_ascii=False) if isinstance(args, str) else json.dumps(args)
    except ValueError:
        pass  # what the client sent, as it sent it
    return f'<tool_call>{{"name": {json.dumps(function.get("name") or "")}, "arguments": {args}}}</tool_call>'
