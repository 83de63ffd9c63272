"""Fallback chains through the real gateway: a killed (unreachable) backend and a
context-length failure both move the request to the next model of the chain."""

import socket

from tokenops.config import ModelConfig, Settings
from tokenops.testing_gateway import FakeBackend, gateway_client


def configure(chains) -> Settings:
    """Settings with ``[plugins.fallback.chains]``, as tokenops.toml would give them (the gateway
    built from them configures its own fallback plugin)."""
    s = Settings()
    s.plugins["fallback"] = {"chains": chains}
    return s


def dead_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here any more: like a killed server
    return f"http://127.0.0.1:{port}/v1"


async def test_killed_backend_falls_back_to_the_next_model():
    from tokenops.backends.openai_http import OpenAIBackend

    settings = configure({"big": ["small"]})
    dead = OpenAIBackend(ModelConfig(name="big", backend="openai", url=dead_url(), max_retries=0, timeout_s=5), Settings())
    small = FakeBackend("small", reply="from small")
    async with gateway_client({"big": [dead], "small": [small]}, settings) as c:
        r = await c.post("/v1/chat/completions", json={"model": "big", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"].strip() == "from small"
        rec = c.gateway.recent[-1]
        assert rec.model_served == "small" and rec.route_reason.startswith("fallback:")
        assert rec.decisions["fallbacks"][0]["from"] == "big"
        # Without a chain the failure reaches the client as an OpenAI-style 5xx.
        c.gateway.plugins.get_plugin("fallback").tokenops_configure(Settings())
        r = await c.post("/v1/chat/completions", json={"model": "big", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code >= 500 and "error" in r.json()


async def test_context_length_error_falls_back_to_a_longer_context_model():
    settings = configure({"small": ["big"]})
    small = FakeBackend("small", reply="short", max_model_len=8)
    big = FakeBackend("big", reply="long context answer", max_model_len=4096)
    long_prompt = " ".join(["word"] * 50)
    async with gateway_client({"small": [small], "big": [big]}, settings) as c:
        r = await c.post("/v1/chat/completions", json={"model": "small", "messages": [{"role": "user", "content": long_prompt}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"].strip() == "long context answer"
        assert c.gateway.recent[-1].decisions["fallbacks"] == [{"from": "small", "to": "big", "error": "context_length"}]
