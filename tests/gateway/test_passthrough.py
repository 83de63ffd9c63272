"""Pass-through to an OpenAI-compatible upstream through a running ``tokenops serve``:
tool calls (streamed piece by piece), refusals, every field the gateway does not act
on, usage, cost and telemetry. The upstream is a real HTTP server (openai_upstream.py)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.gateway.openai_upstream import MODEL_ID, TOOL_CALLS, Upstream
from tokenops.testing_serve import ServeProcess

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}},
]
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "strict": True, "schema": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "Weather and time in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with Upstream() as up:
        config = (f'[[models]]\nname = "agent"\nbackend = "openai"\nurl = "{up.url}"\n'
                  "cost_input_per_1m = 2.0\ncost_output_per_1m = 10.0\n")
        with ServeProcess(tmp_path_factory.mktemp("passthrough"), config=config) as srv:
            yield up, srv


def _clients(up, srv):
    return (openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0),
            openai.OpenAI(base_url=up.url + "/v1", api_key="unused", max_retries=0))


def test_tool_calls_and_fields_pass_through_unchanged(served):
    up, srv = served
    gateway, direct = _clients(up, srv)
    extra = {"logit_bias": {"42": -100}, "presence_penalty": 0.5, "frequency_penalty": 0.25,
             "metadata": {"app": "t"}, "store": False, "service_tier": "auto", "reasoning_effort": "low",
             "top_logprobs": None}
    got = gateway.chat.completions.create(
        model="agent", messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
        response_format=RESPONSE_FORMAT, extra_body={"guided_decoding_backend": "xgrammar", "repetition_penalty": 1.1},
        **{k: v for k, v in extra.items() if v is not None})
    sent = up.bodies[-1]
    assert sent["model"] == MODEL_ID
    assert sent["tools"] == TOOLS and sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is True
    assert sent["response_format"] == RESPONSE_FORMAT
    assert sent["guided_decoding_backend"] == "xgrammar" and sent["repetition_penalty"] == 1.1
    for key, value in extra.items():
        if value is not None:
            assert sent[key] == value, key
    want = direct.chat.completions.create(model=MODEL_ID, messages=MESSAGES, tools=TOOLS)
    assert got.choices[0].finish_reason == "tool_calls" == want.choices[0].finish_reason
    assert got.choices[0].message.content is None
    assert [c.model_dump() for c in got.choices[0].message.tool_calls] == \
        [c.model_dump() for c in want.choices[0].message.tool_calls]
    assert [(c.id, c.function.name, c.function.arguments) for c in got.choices[0].message.tool_calls] == \
        [(cid, name, "".join(pieces)) for cid, name, pieces in TOOL_CALLS]
    assert got.model == "agent"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (11, 17)


def test_streamed_tool_call_deltas_arrive_piece_by_piece(served):
    up, srv = served
    gateway, direct = _clients(up, srv)

    def pieces(client, model):
        deltas, finish, usage = [], None, None
        for chunk in client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="auto",
                                                     stream=True, stream_options={"include_usage": True}):
            if chunk.usage is not None:
                usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
            for c in chunk.choices:
                if c.delta.tool_calls:
                    deltas.append([t.model_dump(exclude_none=True) for t in c.delta.tool_calls])
                finish = c.finish_reason or finish
        return deltas, finish, usage

    got, want = pieces(gateway, "agent"), pieces(direct, MODEL_ID)
    assert got == want
    deltas, finish, usage = got
    assert finish == "tool_calls" and usage == (11, 17)
    assert len(deltas) == sum(1 + len(p) for _, _, p in TOOL_CALLS)  # one chunk per piece, none merged
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for t in delta:
            calls.setdefault(t["index"], []).append(t.get("function", {}).get("arguments", ""))
    assert {k: "".join(v) for k, v in calls.items()} == {k: "".join(p) for k, (_, _, p) in enumerate(TOOL_CALLS)}
    assert json.loads("".join(calls[0])) == {"city": "Paris", "unit": "celsius"}
    assert up.bodies[-1]["stream"] is True


def test_refusal_passes_through(served):
    up, srv = served
    gateway, _ = _clients(up, srv)
    msg = [{"role": "user", "content": "please refuse"}]
    got = gateway.chat.completions.create(model="agent", messages=msg)
    assert got.choices[0].message.refusal == "I can't help with that."
    assert got.choices[0].message.content is None
    streamed = [c.choices[0].delta.refusal for c in gateway.chat.completions.create(model="agent", messages=msg,
                                                                                    stream=True) if c.choices]
    assert "".join(r for r in streamed if r) == "I can't help with that."


def test_other_message_fields_pass_through(served):
    up, srv = served
    gateway, _ = _clients(up, srv)
    msg = [{"role": "user", "content": "think: 6 x 7?"}]
    answer = gateway.chat.completions.create(model="agent", messages=msg)
    got = answer.choices[0].message
    assert got.content == "42" and got.model_extra["reasoning_content"] == "6 times 7 is 42."
    assert answer.usage.completion_tokens_details.reasoning_tokens == 6  # the upstream's count, passed on
    pieces, content, usage = [], [], None
    for chunk in gateway.chat.completions.create(model="agent", messages=msg, stream=True,
                                                 stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for c in chunk.choices:
            if (c.delta.model_extra or {}).get("reasoning_content"):
                pieces.append(c.delta.model_extra["reasoning_content"])
            content.append(c.delta.content or "")
    assert pieces == ["6 times ", "7 is 42."] and "".join(content) == "42"
    assert usage.completion_tokens_details.reasoning_tokens == 6


def test_usage_cost_and_telemetry_count_tool_call_answers(served):
    up, srv = served
    before = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json()["models"].get("agent") or {}
    gateway, _ = _clients(up, srv)
    gateway.chat.completions.create(model="agent", messages=MESSAGES, tools=TOOLS)
    for _ in gateway.chat.completions.create(model="agent", messages=MESSAGES, tools=TOOLS, stream=True):
        pass
    after = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json()["models"]["agent"]
    assert after["requests"] - before.get("requests", 0) == 2
    assert after["input_tokens"] - before.get("input_tokens", 0) == 22
    assert after["output_tokens"] - before.get("output_tokens", 0) == 34
    assert after["cost_usd"] - before.get("cost_usd", 0.0) == pytest.approx((22 * 2.0 + 34 * 10.0) / 1e6)


def test_langchain_bind_tools_through_the_gateway(served):
    from langchain_openai import ChatOpenAI

    up, srv = served
    llm = ChatOpenAI(base_url=srv.base_url, api_key="unused", model="agent", max_retries=0).bind_tools(TOOLS)
    got = llm.invoke("Weather and time in Paris?")
    assert [(c["id"], c["name"], c["args"]) for c in got.tool_calls] == [
        ("call_upstream_0a1b", "get_weather", {"city": "Paris", "unit": "celsius"}),
        ("call_upstream_2c3d", "get_time", {"tz": "Europe/Paris"})]
    assert up.bodies[-1]["tools"] == TOOLS
    merged = None
    for piece in llm.stream("Weather and time in Paris?"):
        merged = piece if merged is None else merged + piece
    assert [(c["id"], c["name"], c["args"]) for c in merged.tool_calls] == [
        (c["id"], c["name"], c["args"]) for c in got.tool_calls]
