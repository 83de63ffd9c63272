"""The Responses API's stream events and output items (tokenops/gateway/responses/responses_stream.py,
responses_output.py) from the gateway's deltas and answers, checked against the openai SDK's
own types, and the field table of docs/serve.md."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import TypeAdapter
from tokenops.backends.base import Delta
from tokenops.gateway.responses.responses_output import ResponseFrame
from tokenops.gateway.responses.responses_request import markdown, parse
from tokenops.gateway.responses.responses_stream import EventWriter
from tokenops.types import GatewayResponse

DOCS = Path(__file__).resolve().parents[2] / "docs" / "serve.md"


def _decode(raw: list[bytes]) -> list[dict]:
    out = []
    for chunk in raw:
        head, data = chunk.decode().split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}" and chunk.endswith(b"\n\n")
        out.append(event)
    return out


def _validate(events: list[dict]) -> None:
    from openai.types.responses import ResponseStreamEvent

    adapter = TypeAdapter(ResponseStreamEvent)
    for e in events:
        adapter.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_reasoning_then_text_then_calls_are_items_in_order():
    writer = EventWriter(ResponseFrame(parse({"model": "m", "input": "hi"}), "m"))
    raw = writer.start()
    for d in (
        Delta(extra={"reasoning_content": "Let me "}, num_tokens=1),
        Delta(extra={"reasoning_content": "think."}, num_tokens=1),
        Delta(text="Sure", num_tokens=1),
        Delta(text=", calling.", num_tokens=1),
        Delta(
            tool_calls=[{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]
        ),
        Delta(tool_calls=[{"index": 0, "function": {"arguments": '{"a":'}}], num_tokens=1),
        Delta(tool_calls=[{"index": 0, "function": {"arguments": "1}"}}], num_tokens=1),
        Delta(
            tool_calls=[{"index": 1, "id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
        ),
        Delta(finish_reason="tool_calls"),
    ):
        raw += writer.push(d)
    done, final = writer.finish(5, 7, 0, 2)
    events = _decode(raw + done)
    _validate(events)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Let me think."
    assert final["output"][1]["content"][0]["text"] == "Sure, calling."
    assert [(c["call_id"], c["arguments"]) for c in final["output"][2:]] == [("call_1", '{"a":1}'), ("call_2", "{}")]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 2 and final["status"] == "completed"
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2, 3]


def test_a_cut_answer_is_incomplete_and_a_broken_stream_fails():
    writer = EventWriter(ResponseFrame(parse({"model": "m", "input": "hi", "max_output_tokens": 2}), "m"))
    raw = writer.start() + writer.push(Delta(text="ab", num_tokens=2)) + writer.push(Delta(finish_reason="length"))
    done, final = writer.finish(3, 2, 0, None)
    events = _decode(raw + done)
    _validate(events)
    assert events[-1]["type"] == "response.incomplete" and final["incomplete_details"] == {
        "reason": "max_output_tokens"
    }

    writer = EventWriter(ResponseFrame(parse({"model": "m", "input": "hi"}), "m"))
    events = _decode(
        writer.start() + writer.push(Delta(text="a", num_tokens=1)) + writer.failed("timeout", "upstream timed out")
    )
    _validate(events)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "timeout"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "upstream timed out"}


def test_an_empty_answer_is_one_empty_message():
    writer = EventWriter(ResponseFrame(parse({"model": "m", "input": "hi"}), "m"))
    events = _decode(writer.start() + writer.push(Delta(finish_reason="stop")) + writer.finish(1, 0, 0, None)[0])
    _validate(events)
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""


def test_a_non_streamed_answer_validates_as_a_response():
    from openai.types.responses import Response

    frame = ResponseFrame(
        parse(
            {
                "model": "m",
                "input": "hi",
                "tools": [{"type": "function", "name": "f"}],
                "text": {"format": {"type": "json_object"}},
                "metadata": {"k": "v"},
            }
        ),
        "m",
    )
    answer = GatewayResponse(
        text="",
        model="m",
        finish_reason="tool_calls",
        prompt_tokens=4,
        completion_tokens=3,
        tool_calls=[{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        extra={"choices": [{"message_extra": {"reasoning_content": "hmm"}}]},
    )
    r = Response.model_validate(frame.finished(answer))
    assert [i.type for i in r.output] == ["reasoning", "function_call"] and r.metadata == {"k": "v"}
    assert r.text.format.type == "json_object" and r.usage.total_tokens == 7


def test_docs_carry_the_field_table():
    assert markdown() in DOCS.read_text(), "docs/serve.md's /v1/responses table differs: paste markdown() there"
