"""Anthropic's Messages API and vLLM's /tokenize through a real ``tokenops serve``, driven by
the anthropic SDK (its own event parser reads the streams).

One server holds four models: ``smol`` (SmolLM2-135M-Instruct, the embedded default, on
the bundled engine: the translated path), ``reasoner`` (the demo reasoning model),
``claude-up`` (an upstream serving /v1/messages: pass-through) and ``chat-up`` (a
chat-completions-only upstream: translated over HTTP, with thinking).
The server has an API key, sent by the SDK as ``x-api-key``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import jsonschema
import pytest

from tests.gateway.anthropic_upstream import MODEL_ID, SIGNATURE, TEXT, THINKING, TOOL_ID, AnthropicUpstream
from tests.gateway.openai_upstream import Upstream
from tokenops.engine.models.default_model import smollm2_path
from tokenops.testing_serve import ServeProcess
from tokenops_plugins.model_optimization._reasoning_tasks import make_reasoning_suite

#: The real model these tests run: the embedded default, SmolLM2-135M-Instruct (its packaged GGUF).
MODEL_PATH = smollm2_path
KEY = "sk-anthropic-test"
#: The demo reasoning model (``<think>`` blocks), for thinking on the bundled engine.
REASONER = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "reasoning-small"
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                              "unit": {"enum": ["celsius", "fahrenheit"]}},
                            "required": ["city", "unit"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = MODEL_PATH()
    with AnthropicUpstream() as native, Upstream() as chat_only:
        config = (f'[gateway]\napi_keys = {{"{KEY}" = "acme"}}\n'
                  f'[[models]]\nname = "smol"\npath = "{path}"\ncost_input_per_1m = 1.0\ncost_output_per_1m = 2.0\n'
                  f'[[models]]\nname = "reasoner"\npath = "{REASONER}"\nreasoning_parser = "think"\n'
                  f'[[models]]\nname = "claude-up"\nbackend = "openai"\nurl = "{native.url}"\napi_key = "sk-upstream"\n'
                  f'[[models]]\nname = "chat-up"\nbackend = "openai"\nurl = "{chat_only.url}"\n')
        with ServeProcess(tmp_path_factory.mktemp("messages"), config=config) as srv:
            yield srv, native, chat_only


@pytest.fixture(scope="module")
def client(served):
    return anthropic.Anthropic(base_url=served[0].url, api_key=KEY, max_retries=0)


def test_create_and_stream_give_the_same_greedy_message(client):
    kw = dict(model="smol", max_tokens=12, system="Answer in one short sentence.", messages=ASK,
              extra_body={"temperature": 0})
    created = client.messages.create(**kw)
    assert created.type == "message" and created.role == "assistant" and created.model == "smol"
    assert [b.type for b in created.content] == ["text"] and created.content[0].text
    assert created.stop_reason in ("end_turn", "max_tokens") and created.usage.output_tokens > 0
    assert created.usage.input_tokens + (created.usage.cache_read_input_tokens or 0) > 10
    with client.messages.stream(**kw) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == final.content[0].text == created.content[0].text
    assert final.stop_reason == created.stop_reason and final.usage.output_tokens == created.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        created.usage.input_tokens + created.usage.cache_read_input_tokens

    # a stop sequence taken from that answer ends the next one there, and is named
    word = created.content[0].text.split()[1]
    with client.messages.stream(**kw, stop_sequences=[word]) as stream:
        stopped_stream = stream.get_final_message()
    for stopped in (client.messages.create(**kw, stop_sequences=[word]), stopped_stream):
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
        assert word not in (stopped.content[0].text if stopped.content else "")


def test_stream_ends_with_the_decisions_known_at_its_end(client):
    """Issue 37: the x-tokenops-* values a stream knows only at its end (the cost) come in its
    ``message_delta``, an extra key the anthropic SDK keeps; the headers carry the rest."""
    with client.messages.stream(model="smol", max_tokens=6, messages=ASK) as stream:
        headers = stream.response.headers
        events = list(stream)
        final = stream.get_final_message()
    [delta] = [e for e in events if e.type == "message_delta"]
    decisions = delta.model_extra["tokenops"]
    assert final.usage.output_tokens > 0 and "x-tokenops-cost-usd" not in headers
    assert decisions["model"] == headers["x-tokenops-model"] == "smol"
    assert decisions["replica"] == headers["x-tokenops-replica"] and decisions["cache"] == headers["x-tokenops-cache"]
    assert decisions["cost_usd"] > 0  # smol costs 1 and 2 USD per 1M tokens


def test_forced_tool_use_then_tool_result_round_trip(client):
    kw = dict(model="smol", max_tokens=48, tools=[WEATHER], extra_body={"temperature": 0})
    first = client.messages.create(**kw, messages=ASK, tool_choice={"type": "tool", "name": "get_weather"})
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id
    jsonschema.validate(use.input, WEATHER["input_schema"])  # grammar-constrained: valid on any model

    any_one = {"type": "any", "disable_parallel_tool_use": True}  # one call, then the turn ends
    with client.messages.stream(**kw, messages=ASK, tool_choice=any_one) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds and final.stop_reason == "tool_use"
    jsonschema.validate(next(b for b in final.content if b.type == "tool_use").input, WEATHER["input_schema"])

    history = [*ASK, {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": "18 degrees celsius and sunny"}]}]
    answer = client.messages.create(**{**kw, "max_tokens": 8}, messages=history, tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text


def test_count_tokens_is_the_engines_prompt_count(served, client):
    srv = served[0]
    counted = client.messages.count_tokens(model="smol", system="Be brief.", messages=ASK, tools=[WEATHER])
    used = client.messages.create(model="smol", max_tokens=1, system="Be brief.", messages=ASK, tools=[WEATHER])
    assert counted.input_tokens == used.usage.input_tokens + used.usage.cache_read_input_tokens
    longer = client.messages.count_tokens(model="smol", system="Be brief. Answer in French, politely.", messages=ASK,
                                          tools=[WEATHER])
    assert longer.input_tokens > counted.input_tokens  # the system prompt counts
    plain = client.messages.count_tokens(model="smol", messages=ASK).input_tokens

    headers = {"x-api-key": KEY}
    r = httpx.post(srv.url + "/tokenize", json={"model": "smol", "messages": ASK}, headers=headers)
    assert r.status_code == 200 and r.json()["count"] == plain == len(r.json()["tokens"])
    r = httpx.post(srv.url + "/tokenize", json={"model": "smol", "prompt": "Hello, Paris!", "return_token_strs": True},
                   headers=headers)
    body = r.json()
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) and body["max_model_len"] > 0
    r = httpx.post(srv.url + "/detokenize", json={"model": "smol", "tokens": body["tokens"]}, headers=headers)
    assert r.json() == {"prompt": "Hello, Paris!"}
    for field, value in (("bogus", 1), ("chat_template", "{{ messages }}")):
        r = httpx.post(srv.url + "/tokenize", json={"model": "smol", "prompt": "x", field: value}, headers=headers)
        assert r.status_code == 400 and field in r.json()["error"]["message"], r.text


def test_errors_are_anthropic_errors(served, client):
    srv = served[0]
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=srv.url, api_key="sk-wrong", max_retries=0).messages.create(
            model="smol", max_tokens=4, messages=ASK)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "not_found_error" and "no-such-model" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="smol", max_tokens=4, messages=ASK, extra_body={"frobnicate": 1})
    assert e.value.body["error"]["type"] == "invalid_request_error" and "frobnicate" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:  # an Anthropic field the translation cannot carry
        client.messages.create(model="smol", max_tokens=4, messages=ASK, container="c-1")
    assert "container" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="no-such-model", messages=ASK)

    # a managed key with a spent budget: 429 in Anthropic's shape, as on chat completions
    r = httpx.post(srv.url + "/admin/keys", headers=srv.admin_headers,
                   json={"tenant": "acme", "budget_usd": 1e-9, "budget_period": "daily"})
    assert r.status_code == 201, r.text
    budgeted = anthropic.Anthropic(base_url=srv.url, api_key=r.json()["key"], max_retries=0)
    budgeted.messages.create(model="smol", max_tokens=2, messages=ASK)
    with pytest.raises(anthropic.RateLimitError) as e:
        budgeted.messages.create(model="smol", max_tokens=2, messages=ASK)
    assert e.value.body["error"]["type"] == "rate_limit_error" and e.value.response.headers.get("retry-after")


def test_thinking_blocks_from_a_reasoning_model_on_the_bundled_engine(client):
    kw = dict(model="reasoner", max_tokens=160, extra_body={"temperature": 0},
              messages=[{"role": "user", "content": make_reasoning_suite("multistep", 1, seed=0, terms=(5, 5))[0].prompt}])
    created = client.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in created.content] == ["thinking", "text"]
    assert created.content[0].thinking and "<think>" not in created.content[0].thinking + created.content[1].text
    with client.messages.stream(**kw, thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        kinds = {e.type for e in stream}
        final = stream.get_final_message()
    assert "thinking" in kinds and [b.model_dump() for b in final.content] == [b.model_dump() for b in created.content]
    short = client.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 4})
    assert len(short.content[0].thinking) < len(created.content[0].thinking)  # the budget acts
    hidden = client.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"})
    assert [b.model_dump() for b in hidden.content] == [created.content[1].model_dump()]
    assert hidden.usage.output_tokens == created.usage.output_tokens  # it still thought
    off = client.messages.create(**kw, thinking={"type": "disabled"})
    assert not [b for b in off.content if b.type == "thinking" and b.thinking.strip()]
    with pytest.raises(anthropic.BadRequestError) as e:  # a model without a reasoning parser does not think
        client.messages.create(model="smol", max_tokens=4, messages=ASK, thinking={"type": "enabled", "budget_tokens": 9})
    assert "thinking" in e.value.body["error"]["message"]


def test_upstream_serving_messages_gets_the_request_as_sent(served, client):
    srv, native, _ = served
    direct = anthropic.Anthropic(base_url=native.url, api_key="unused", max_retries=0)
    kw = dict(max_tokens=32, messages=ASK, tools=[WEATHER], container="c-1",
              extra_headers={"anthropic-beta": "test-beta"})
    with client.messages.stream(model="claude-up", **kw) as stream:
        via_gateway = [e.model_dump() for e in stream]
        final = stream.get_final_message()
    # the upstream's message_delta, held to the end, carries the gateway's decisions: the rest is as sent
    [decisions] = [e.pop("tokenops") for e in via_gateway if e["type"] == "message_delta"]
    assert decisions["model"] == "claude-up" and decisions["replica"].startswith("claude-up")
    path, body, headers = native.seen[-1]
    assert path == "/v1/messages" and body["model"] == MODEL_ID and body["container"] == "c-1" and body["stream"]
    assert body["tools"] == [WEATHER] and headers["anthropic-beta"] == "test-beta"
    assert headers["x-api-key"] == "sk-upstream" and headers["authorization"] == "Bearer sk-upstream"  # not the client's
    with direct.messages.stream(model=MODEL_ID, **kw) as stream:
        want = [e.model_dump() for e in stream]
    assert json.dumps(via_gateway).replace('"claude-up"', "M") == json.dumps(want).replace(f'"{MODEL_ID}"', "M")
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].signature == SIGNATURE and final.content[2].id == TOOL_ID
    assert final.content[2].input == {"city": "Paris"} and final.usage.cache_read_input_tokens == 4

    created = client.messages.create(model="claude-up", **kw)
    assert created.model == "claude-up" and created.content[1].text == TEXT and created.content[0].thinking == THINKING
    assert client.messages.count_tokens(model="claude-up", messages=ASK).input_tokens == 42
    path, body, headers = native.seen[-1]
    assert path == "/v1/messages/count_tokens" and body["model"] == MODEL_ID and headers["x-api-key"] == "sk-upstream"
    r = httpx.post(srv.url + "/tokenize", json={"model": "claude-up", "prompt": "x", "cache_salt": "s"},
                   headers={"x-api-key": KEY})
    assert r.json()["tokens"] == [7, 8, 9] and native.seen[-1][1] == {"model": MODEL_ID, "prompt": "x", "cache_salt": "s"}
    r = httpx.post(srv.url + "/detokenize", json={"model": "claude-up", "tokens": [7, 8, 9]}, headers={"x-api-key": KEY})
    assert r.json() == {"prompt": "seven eight nine"} and native.seen[-1][0] == "/detokenize"


def test_chat_only_upstream_is_translated_with_thinking_and_tool_use(client):
    thought = client.messages.create(model="chat-up", max_tokens=32, messages=[{"role": "user", "content": "think"}])
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in thought.content] == \
        [("thinking", "6 times 7 is 42."), ("text", "42")]
    with client.messages.stream(model="chat-up", max_tokens=32, messages=[{"role": "user", "content": "think"}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert "thinking" in kinds and final.content[0].thinking == "6 times 7 is 42." and final.content[1].text == "42"
    with client.messages.stream(model="chat-up", max_tokens=32, messages=ASK, tools=[WEATHER]) as s:
        final = s.get_final_message()
    calls = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and [c.name for c in calls] == ["get_weather", "get_time"]
    assert calls[0].input == {"city": "Paris", "unit": "celsius"}
    with pytest.raises(anthropic.BadRequestError) as e:  # this upstream cannot take it as sent, nor can chat carry it
        client.messages.create(model="chat-up", max_tokens=4, messages=ASK, container="c-1")
    assert "container" in e.value.body["error"]["message"]


def test_messages_requests_are_recorded_with_tokens_and_cost(served, client):
    srv = served[0]
    client.messages.create(model="smol", max_tokens=4, messages=ASK)
    r = httpx.get(srv.url + "/admin/requests", headers=srv.admin_headers, params={"limit": 1})
    [last] = r.json()["requests"]
    assert last["decisions"]["api"] == "messages" and last["tokens_in"] > 0 and last["tokens_out"] > 0
    out = subprocess.run([sys.executable, "-m", "tokenops", "report", "--json", "--store", str(srv.store_path)],
                         capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert report["requests"] > 0 and report["tokens_in"] > 0 and report["cost_usd"] > 0


@pytest.mark.slow  # 32 sampled tokens on SmolLM2; test_create_and_stream... proves the same path by default
def test_the_documented_example_runs(served, capsys):
    srv = served[0]
    docs = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text()
    code = docs.split("<!-- messages-example -->\n```python\n", 1)[1].split("```", 1)[0]
    code = code.replace('"http://127.0.0.1:8000"', repr(srv.url)).replace('"unused"', repr(KEY))
    exec(compile(code.replace('"smollm2-135m-instruct"', '"smol"'), "docs/serve.md", "exec"), {})
    text, summary = capsys.readouterr().out.rsplit("\n", 2)[:2]
    reason, num_in, num_out = summary.split()
    assert text.strip() and reason in ("end_turn", "max_tokens") and int(num_in) > 0 and 0 < int(num_out) <= 32
