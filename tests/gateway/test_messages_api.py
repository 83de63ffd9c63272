"""Anthropic Messages: the translation to the internal chat request, the event stream
encoder, and error shapes on the in-process gateway (fast; the SDK end-to-end tests are
in test_messages_serve.py)."""

from __future__ import annotations

import json

from tokenops.backends.base import Delta
from tokenops.config import GatewaySettings, Settings
from tokenops.gateway.anthropic.messages_schema import chat_body
from tokenops.gateway.anthropic.messages_stream import encode_stream
from tokenops.testing_gateway import FakeBackend, gateway_client
from tokenops.types import GatewayRequest, Rejection

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _body(**kw):
    return {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **kw}


def test_blocks_tools_and_choices_translate_to_chat():
    data = _body(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather?", "cache_control": {"type": "ephemeral"}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "thanks"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "is_error": True,
                        "content": [{"type": "text", "text": "timeout"}],
                    },
                ],
            },
        ],
        tools=[{"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        stop_sequences=["\n\n"],
        temperature=0.5,
        top_k=5,
        top_p=0.9,
        metadata={"user_id": "u-7"},
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}, "effort": "max"},
        thinking={"type": "enabled", "budget_tokens": 64},
        stream=True,
        service_tier="auto",
    )
    body, problems = chat_body(data)
    assert problems == []
    assert body["messages"] == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: timeout"},  # results answer the call first
        {"role": "user", "content": "thanks"},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA, "description": "Weather"}}
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert (body["stop"], body["temperature"], body["top_k"], body["top_p"], body["user"]) == (
        ["\n\n"],
        0.5,
        5,
        0.9,
        "u-7",
    )
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA and body["reasoning_effort"] == "high"
    assert body["max_thinking_tokens"] == 64 and body["stream_options"] == {"include_usage": True}
    for choice, want in (({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none")):
        assert chat_body(_body(tool_choice=choice))[0]["tool_choice"] == want
    assert chat_body(_body(thinking={"type": "disabled"}), is_reasoning_model=True)[0]["max_thinking_tokens"] == 0
    assert "max_thinking_tokens" not in chat_body(_body(thinking={"type": "disabled"}))[0]


def test_what_chat_cannot_carry_is_noted_by_name():
    _, problems = chat_body(
        _body(
            container="c-1",
            speed="fast",
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
            messages=[
                {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]},
                {"role": "assistant", "content": "The answer is ("},
            ],
        )
    )
    assert [param for param, _ in problems] == [
        "container",
        "speed",
        "messages[0].content[0].type",
        "messages[1]",
        "tools[0].type",
    ]
    assert chat_body(_body(speed="standard"))[1] == []  # the neutral value is fine


async def _events(deltas, decisions=None):
    request = GatewayRequest(kind="chat", model="m", body={}, decisions=decisions or {})

    async def gen():
        for d in deltas:
            yield d

    out = []
    async for chunk in encode_stream(request, gen(), None, "m"):
        name, data = chunk.decode().strip().split("\n")
        out.append((name[len("event: ") :], json.loads(data[len("data: ") :])))
    return out


async def test_stream_blocks_open_and_close_in_order():
    events = await _events(
        [
            Delta(extra={"reasoning_content": "Think"}),
            Delta(extra={"reasoning_content": "ing."}),
            Delta(text="Calling."),
            Delta(
                tool_calls=[
                    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}
                ]
            ),
            Delta(tool_calls=[{"index": 0, "function": {"arguments": '{"x":'}}]),
            Delta(tool_calls=[{"index": 0, "function": {"arguments": " 1}"}}]),
            Delta(
                tool_calls=[
                    {"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}
                ]
            ),
            Delta(finish_reason="tool_calls"),
            Delta(prompt_tokens=12, completion_tokens=7, cached_tokens=4),
        ]
    )
    names = [n for n, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    starts = [e["content_block"] for n, e in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use", "tool_use"]
    assert (starts[2]["id"], starts[2]["name"], starts[3]["id"]) == ("call_a", "f", "call_b")
    deltas = [(e["index"], e["delta"]) for n, e in events if n == "content_block_delta"]
    assert deltas[0] == (0, {"type": "thinking_delta", "thinking": "Think"})
    assert [d["partial_json"] for i, d in deltas if i == 2] == ['{"x":', " 1}"]
    [final] = [e for n, e in events if n == "message_delta"]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"] == {
        "input_tokens": 8,
        "output_tokens": 7,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
    }


async def test_stream_names_the_matched_stop_sequence_and_length():
    events = await _events(
        [Delta(text="a"), Delta(finish_reason="stop"), Delta(prompt_tokens=1, completion_tokens=1)],
        decisions={"stop_sequence": "END"},
    )
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    events = await _events(
        [Delta(text="a"), Delta(finish_reason="length"), Delta(prompt_tokens=1, completion_tokens=1)]
    )
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"


def _is_anthropic_error(r, status, kind):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error" and body["error"]["type"] == kind
    assert set(body["error"]) == {"type", "message"} and body["error"]["message"]
    return body["error"]["message"]


async def test_errors_on_this_path_are_anthropic_errors(register_plugin):
    class Limiter:
        from tokenops import hookimpl

        @hookimpl
        def tokenops_admit(self, request):
            return (
                Rejection(status=429, message="slow down", retry_after_s=3.0)
                if "flood" in request.prompt_text()
                else None
            )

    register_plugin(Limiter(), "test-messages-limiter")
    settings = Settings(gateway=GatewaySettings(api_keys={"sk-a": "acme"}, max_body_bytes=4000))
    key = {"x-api-key": "sk-a", "anthropic-version": "2023-06-01"}
    backend = FakeBackend()
    async with gateway_client([backend], settings=settings) as c:
        ok = await c.post("/v1/messages", json=_body(model="fake-model"), headers=key)
        assert ok.status_code == 200 and ok.json()["type"] == "message" and backend.requests[-1].tenant == "acme"
        _is_anthropic_error(await c.post("/v1/messages", json=_body(model="fake-model")), 401, "authentication_error")
        r = await c.post(
            "/v1/messages", json=_body(model="fake-model", messages=[{"role": "user", "content": "flood"}]), headers=key
        )
        assert "slow down" in _is_anthropic_error(r, 429, "rate_limit_error") and r.headers["retry-after"] == "3"
        _is_anthropic_error(
            await c.post("/v1/messages", content=b"{", headers={**key, "content-type": "application/json"}),
            400,
            "invalid_request_error",
        )
        _is_anthropic_error(
            await c.post(
                "/v1/messages",
                json=_body(model="fake-model", messages=[{"role": "user", "content": "x" * 5000}]),
                headers=key,
            ),
            413,
            "request_too_large",
        )
        msg = _is_anthropic_error(
            await c.post("/v1/messages", json={"model": "fake-model", "messages": []}, headers=key),
            400,
            "invalid_request_error",
        )
        assert "max_tokens" in msg
        msg = _is_anthropic_error(
            await c.post("/v1/messages", json=_body(model="fake-model", top_n=1, foo=2), headers=key),
            400,
            "invalid_request_error",
        )
        assert "`top_n`, `foo`" in msg
        r = await c.post(
            "/v1/messages",
            json=_body(model="fake-model", stream=True, messages=[{"role": "user", "content": "flood"}]),
            headers=key,
        )
        _is_anthropic_error(r, 429, "rate_limit_error")  # refused before the stream starts: a status, not an event


def test_docs_carry_the_generated_table_and_every_sdk_field_has_a_row():
    import re
    import typing
    from pathlib import Path

    from anthropic.types import message_count_tokens_params, message_create_params
    from tokenops.gateway.anthropic.messages_schema import COUNT_FIELDS, FIELDS, markdown

    text = (Path(__file__).parents[2] / "docs" / "serve.md").read_text()
    found = re.search(r"<!-- messages-fields:begin -->\n(.*?)<!-- messages-fields:end -->", text, re.S)
    assert found and found.group(1) == markdown(), (
        "docs/serve.md is stale: paste `python -m tokenops.gateway.anthropic.messages_schema`"
    )
    rows = {f.name for f in FIELDS}
    sdk = set(typing.get_type_hints(message_create_params.MessageCreateParamsBase)) | {"stream"}
    # sampling fields the API takes that this SDK version no longer lists as arguments (sent in extra_body)
    assert sdk | {"temperature", "top_p", "top_k"} <= rows, sdk - rows
    assert set(typing.get_type_hints(message_count_tokens_params.MessageCountTokensParams)) <= set(COUNT_FIELDS)


async def test_unknown_paths_and_methods_under_messages_are_anthropic_errors():
    async with gateway_client([FakeBackend()]) as c:
        _is_anthropic_error(await c.post("/v1/messages/batches", json={}), 404, "not_found_error")
        _is_anthropic_error(await c.get("/v1/messages"), 405, "invalid_request_error")
        msg = _is_anthropic_error(
            await c.post(
                "/v1/messages",
                json=_body(
                    model="fake-model",
                    messages=[
                        {"role": "user", "content": [{"type": "text", "text": "x", "citations": [{"type": "x"}]}]}
                    ],
                ),
            ),
            400,
            "invalid_request_error",
        )
        assert "citations" in msg  # a block field the translation would lose is named, not dropped


def test_thinking_on_a_model_known_not_to_think_is_named():
    _, problems = chat_body(_body(thinking={"type": "enabled", "budget_tokens": 9}), is_reasoning_model=False)
    assert [p for p, _ in problems] == ["thinking"]
    assert chat_body(_body(thinking={"type": "enabled", "budget_tokens": 9}), is_reasoning_model=None)[1] == []


async def test_cache_and_routing_plugins_see_messages_requests_as_chat_requests(register_plugin):
    from tokenops import hookimpl
    from tokenops.types import GatewayResponse, RouteDecision

    seen = []

    class Plugins:
        @hookimpl(tryfirst=True)
        def tokenops_route(self, request, candidates, profiles):
            seen.append(request.messages)
            return RouteDecision(model="cheap", reason="test") if request.model == "auto" else None

        @hookimpl
        def tokenops_cache_lookup(self, request):
            if request.prompt_text().endswith("cached?"):
                return GatewayResponse(text="from the cache", model="cheap", prompt_tokens=5, completion_tokens=3)
            return None

    register_plugin(Plugins(), "test-messages-plugins")
    async with gateway_client({"cheap": [FakeBackend("cheap", reply="routed answer")]}) as c:
        r = await c.post("/v1/messages", json=_body(model="auto", system="S"))
        assert r.status_code == 200 and r.json()["content"] == [{"type": "text", "text": "routed answer "}]
        assert r.json()["model"] == "cheap" and seen[-1] == [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "hi"},
        ]
        r = await c.post("/v1/messages", json=_body(model="auto", messages=[{"role": "user", "content": "cached?"}]))
        assert r.json()["content"] == [{"type": "text", "text": "from the cache"}]
        r = await c.post(
            "/v1/messages", json=_body(model="auto", stream=True, messages=[{"role": "user", "content": "cached?"}])
        )
        texts = [
            json.loads(line[6:])["delta"].get("text")
            for line in r.text.splitlines()
            if line.startswith("data: ") and '"content_block_delta"' in line
        ]
        assert texts == ["from the cache"] and "event: message_stop" in r.text
        recent = (await c.get("/admin/requests", headers={"Authorization": "Bearer test-admin-key"})).json()["requests"]
        assert [q["decisions"]["api"] for q in recent[:3]] == ["messages"] * 3
        assert recent[0]["decisions"]["cache"] == "hit"
