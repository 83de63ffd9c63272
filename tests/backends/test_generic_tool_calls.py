"""The generic tool format's prompt and stream (tokenops/backends/tool_format.py, generic_tool_calls.py)."""

from __future__ import annotations

from tokenops.backends.generic_tool_calls import GenericToolCallParser
from tokenops.backends.tool_format import generic_messages


def _run(pieces: list[str]) -> tuple[str, list[dict]]:
    stream = GenericToolCallParser().stream(True)
    content, calls = "", []
    for piece in pieces:
        text, new = stream.push(piece)
        content, calls = content + text, calls + new
    text, new = stream.finish()
    return content + text, calls + new


def test_the_no_call_preamble_is_dropped_and_the_reply_is_content():
    content, calls = _run(['<tool_call>{"name": "te', 'xt"}</tool_call>\n', "Hello <tool_call> there"])
    assert content == "Hello <tool_call> there" and calls == []


def test_calls_stream_as_openai_deltas():
    content, calls = _run(['<tool_call>{"name": "add", "arguments": {"a": 1, ', '"b": 2}}</tool_call>'])
    assert content == "" and calls[0]["function"]["name"] == "add"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"a": 1, "b": 2}'


def test_results_and_calls_of_earlier_turns_are_rendered_as_text():
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    out = generic_messages(messages, tools)
    assert (
        out[0]["role"] == "system"
        and out[0]["content"].startswith("Be brief.\n\n")
        and '"name": "add"' in out[0]["content"]
    )
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
    }
    assert out[3] == {"role": "user", "content": "add returned: 3\nAnswer my question with this result."}
    two = generic_messages([*messages, {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "4"}], tools)
    assert two[3]["content"] == "add returned: 3\nadd returned: 4\nAnswer my question with these results."
