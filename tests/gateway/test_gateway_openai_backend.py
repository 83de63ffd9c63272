"""The ``openai`` backend: a gateway in front of a second tokenops server on loopback."""

from __future__ import annotations

import time

import httpx
import openai

from tokenops.config import ModelConfig, Settings
from tokenops.gateway.app import create_app
from tokenops.gateway.auth import hash_key
from tokenops.testing_gateway import FakeBackend, gateway_client


def _front_settings(url: str, **kw) -> Settings:
    return Settings(models=[ModelConfig(name="remote", backend="openai", url=url, served_model="fake-model", **kw)])


async def test_gateway_over_a_second_tokenops_streams_token_by_token(thread_server):
    upstream_backend = FakeBackend(reply="one two three four five", delay_s=0.08)
    upstream = create_app(None, [upstream_backend], admin_key_hash=hash_key("k"))
    with thread_server(upstream) as up:
        front = create_app(_front_settings(up.url), admin_key_hash=hash_key("k"))
        with thread_server(front) as fr:
            async with httpx.AsyncClient(timeout=30) as http:
                client = openai.AsyncOpenAI(base_url=fr.url + "/v1", api_key="x", http_client=http, max_retries=0)
                stream = await client.chat.completions.create(
                    model="remote", messages=[{"role": "user", "content": "go"}], stream=True,
                    stream_options={"include_usage": True})
                arrivals, texts = [], []
                async for ch in stream:
                    if ch.choices and ch.choices[0].delta.content:
                        arrivals.append(time.perf_counter())
                        texts.append(ch.choices[0].delta.content)
                    last = ch
                assert texts == ["one ", "two ", "three ", "four ", "five "]
                gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
                assert min(gaps) > 0.04, gaps  # each token arrived on its own, not buffered
                assert last.usage.completion_tokens == 5 and last.model == "remote"

                r = await client.completions.create(model="remote", prompt="hi", max_tokens=2)
                assert r.choices[0].text == "one two " and r.usage.completion_tokens == 2
                assert r.choices[0].finish_reason == "length"
            assert upstream_backend.requests[-1].max_tokens == 2
            rec = front.state.gateway.recent[-1]
            assert rec.backend_kind == "openai" and rec.tokens_out == 2


async def test_upstream_errors_keep_their_status_and_unreachable_upstreams_are_503(thread_server):
    upstream = create_app(None, [FakeBackend(max_model_len=20)], admin_key_hash=hash_key("k"))
    with thread_server(upstream) as up:
        async with gateway_client(None, settings=_front_settings(up.url)) as c:
            r = await c.post("/v1/completions", json={"model": "remote", "prompt": "w " * 40})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
            assert "maximum context length" in r.json()["error"]["message"]
    # nothing listens on a port we just closed: connect errors are retried, then 503
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with gateway_client(None, settings=_front_settings(dead, max_retries=1)) as c:
        t0 = time.perf_counter()
        r = await c.post("/v1/completions", json={"model": "remote", "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
        assert time.perf_counter() - t0 < 5
