"""The official openai client against the gateway (ASGI transport, FakeBackend)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tokenops.testing_gateway import FakeBackend, gateway_client


def _client(c: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://localhost/v1", api_key="unused", http_client=c, max_retries=0)


async def test_chat_non_streaming_returns_message_and_usage():
    async with gateway_client([FakeBackend(reply="one two three")]) as c:
        r = await _client(c).chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi you"}])
    assert r.object == "chat.completion"
    assert r.model == "fake-model"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == "one two three "
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 3
    assert r.usage.prompt_tokens == 5  # 2 words + 3 template tokens in FakeBackend
    assert r.usage.total_tokens == 8
    assert r.usage.prompt_tokens_details.cached_tokens == 0


async def test_chat_streaming_has_role_chunk_deltas_finish_usage_and_done():
    async with gateway_client([FakeBackend(reply="a b c d")]) as c:
        stream = await _client(c).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "x"}], stream=True,
            stream_options={"include_usage": True}, max_tokens=3)
        chunks = [ch async for ch in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [ch.choices[0].delta.content for ch in chunks[1:] if ch.choices and ch.choices[0].delta.content]
    assert contents == ["a ", "b ", "c "]
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert all(ch.usage is None for ch in chunks[:-1])
    assert len({ch.id for ch in chunks}) == 1


async def test_stream_without_include_usage_sends_no_usage_and_ends_with_done():
    async with gateway_client([FakeBackend(reply="a b")]) as c:
        r = await c.post("/v1/chat/completions", json={"model": "fake-model", "stream": True,
                                                        "messages": [{"role": "user", "content": "x"}]})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line for line in r.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert '"usage"' not in r.text


async def test_completions_non_streaming_and_streaming():
    async with gateway_client([FakeBackend(reply="x y z")]) as c:
        client = _client(c)
        r = await client.completions.create(model="fake-model", prompt="say", max_tokens=10)
        assert r.object == "text_completion" and r.choices[0].text == "x y z "
        assert r.usage.completion_tokens == 3
        stream = await client.completions.create(model="fake-model", prompt="say", stream=True,
                                                 stream_options={"include_usage": True})
        chunks = [ch async for ch in stream]
    texts = [ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].text]
    assert texts == ["x ", "y ", "z "]
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 3


async def test_stop_and_models_list():
    async with gateway_client([FakeBackend(reply="a b STOP c")]) as c:
        client = _client(c)
        r = await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}],
                                                 stop=["STOP"])
        assert r.choices[0].message.content == "a b "
        models = await client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]


async def test_errors_surface_as_openai_exceptions():
    async with gateway_client([FakeBackend()]) as c:
        client = _client(c)
        with pytest.raises(openai.NotFoundError) as e:
            await client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
        assert e.value.body["code"] == "model_not_found"
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=-5)
