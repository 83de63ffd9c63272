"""The confidence gate for free tool calls (tokenops/backends/tool_confidence.py) through a real
``tokenops serve`` driven by the openai SDK, on the default model (SmolLM2-135M-Instruct, its generic
tool format) served twice: ``open`` with the gate off and ``gated`` with ``tool_call_min_confidence = 1``
(every call the model is less than certain of is gated). The same greedy question gets a call from
``open`` (whose confidence, from the logprobs, is under 1) and a text answer from ``gated``, streamed or
not, with nothing of the call in it; a forced call is never gated; the decision is in the request's trace.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from tests.real_model import SERVE_ENV, gguf_path, serve_args
from tokenops.backends.tool_confidence import CallConfidence
from tokenops.testing_serve import ServeProcess

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    serve_args()  # skips when the default model's package is not installed
    config = f"""
[[models]]
name = "open"
path = "{gguf_path()}"
tool_call_min_confidence = 0

[[models]]
name = "gated"
path = "{gguf_path()}"
tool_call_min_confidence = 1.0
"""
    with ServeProcess(tmp_path_factory.mktemp("tool-gate"), config=config, env=SERVE_ENV, store=False) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=600)


def _last_decisions(srv) -> dict:
    rows = httpx.get(f"{srv.url}/admin/requests?limit=1", headers=srv.admin_headers, timeout=30).json()["requests"]
    return rows[0]["decisions"]


def test_a_low_confidence_free_call_comes_back_as_a_text_answer(srv, client):
    out = client.chat.completions.create(
        model="open", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=48, logprobs=True
    )
    [call] = out.choices[0].message.tool_calls
    judge = CallConfidence(1.0)
    judge.add([e.model_dump() for e in out.choices[0].logprobs.content])
    confidence = judge.confidence(call.function.name, call.function.arguments)
    assert confidence is not None and confidence < 1.0  # the gate at 1 refuses this call

    gated = client.chat.completions.create(model="gated", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=48)
    choice = gated.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason in ("stop", "length")
    assert choice.message.content and choice.message.content.strip()
    assert "<tool_call>" not in choice.message.content and '"arguments"' not in choice.message.content
    assert choice.logprobs is None  # the gate's logprobs are not the client's
    gate = _last_decisions(srv)["tool_call_gate"]
    assert gate["min_confidence"] == 1.0 and gate["answered_again"] is True
    assert gate["calls"][0]["name"] == "get_weather" and gate["calls"][0]["gated"] is True
    # both answers' tokens are counted; the prompt is the request's own
    assert gated.usage.prompt_tokens == out.usage.prompt_tokens and gated.usage.completion_tokens > 0


def test_a_streamed_gated_call_sends_nothing_of_the_call(client):
    chunks = list(
        client.chat.completions.create(
            model="gated", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=48, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not [d for d in deltas if d.tool_calls]
    text = "".join(d.content or "" for d in deltas)
    assert text.strip() and "<tool_call>" not in text and '"arguments"' not in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (
        ["stop"],
        ["length"],
    )


def test_a_forced_call_is_never_gated(srv, client):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        out = client.chat.completions.create(
            model="gated", messages=ASK, tools=[WEATHER], tool_choice=choice, temperature=0, max_tokens=48
        )
        [call] = out.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
        assert "tool_call_gate" not in _last_decisions(srv)
