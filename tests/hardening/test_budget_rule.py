"""Issue 51 part 1 against a real ``tokenops serve`` (the demo chat model; the gateway is under
test): one budget rule for schemas on every API (nested ``pattern`` repetitions multiply),
schema and tokenizer work off the event loop (``/health`` answers while 300 KB tool schemas
are counted), and the field caps (``logit_bias``, batched prompts, ``n`` x ``top_logprobs``)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest
from tests.serve_configs import config as serve_config
from tests.serve_configs import local_model
from tokenops.engine.models.default_model import shipped_model_dir
from tokenops.testing_serve import ServeProcess

MODEL = "demo"
#: Nested repetitions: no quantifier over the server's 65,536-character ceiling, their product far over it.
NESTED = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a{1000}){1000}$"}},
          "required": ["code"]}
NESTED_PLUS = {"type": "object", "properties": {"code": {"type": "string", "pattern": "((a+){300}){300}"}}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("budget_rule"), config=serve_config(
            local_model(MODEL, shipped_model_dir()))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(served):
    return anthropic.Anthropic(base_url=served.url, api_key="none", max_retries=0, timeout=120)


def _refused(call, error=openai.BadRequestError):
    with pytest.raises(error) as e:
        call()
    return e.value


def _names_pattern(err) -> None:
    body = err.body if isinstance(err.body, dict) else {}
    inner = body.get("error", body)
    assert inner.get("type") in ("invalid_request_error", None) or err.status_code == 400
    assert "pattern" in str(inner.get("message")), inner
    code = inner.get("code")
    assert code in ("schema_too_large", None), inner  # Anthropic's shape has no code; the message names it


def _fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def _chat(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], **kw)


def test_nested_pattern_is_refused_on_chat_whatever_max_tokens_says(client):
    for schema in (NESTED, NESTED_PLUS):
        for extra in ({"max_tokens": 2**31 - 1}, {}):
            err = _refused(lambda s=schema, x=extra: _chat(client, response_format=_fmt(s), **x))
            assert err.code == "schema_too_large" and err.param == "response_format.json_schema.schema"
            _names_pattern(err)
            tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
            err = _refused(lambda t=tool, x=extra: _chat(client, tools=[t], **x))  # not even forced
            assert err.code == "schema_too_large" and err.param == "tools[0].function.parameters"
    ok = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(ab){2}$"}}, "required": ["code"]}
    assert _chat(client, response_format=_fmt(ok), max_tokens=24).choices[0].message.content is not None


def test_nested_pattern_is_refused_on_responses(client):
    for extra in ({"max_output_tokens": 2**31 - 1}, {}):
        err = _refused(lambda x=extra: client.responses.create(model=MODEL, input="hi", text={"format": {
            "type": "json_schema", "name": "answer", "schema": NESTED}}, **x))
        assert err.code == "schema_too_large" and err.param == "text.format.schema"
        _names_pattern(err)
        err = _refused(lambda x=extra: client.responses.create(model=MODEL, input="hi", tools=[
            {"type": "function", "name": "f", "parameters": NESTED}], **x))
        assert err.code == "schema_too_large" and err.param == "tools[0].parameters"


def test_responses_schema_is_held_to_max_output_tokens(client):
    long = {"type": "object", "properties": {"a": {"type": "string", "minLength": 2000}}, "required": ["a"]}
    err = _refused(lambda: client.responses.create(model=MODEL, input="hi", max_output_tokens=16, text={"format": {
        "type": "json_schema", "name": "answer", "schema": long}}))
    assert err.code == "schema_too_large" and "minLength" in err.message


def test_nested_pattern_is_refused_on_messages_count_tokens_and_tokenize(served, claude):
    tool = {"name": "f", "description": "d", "input_schema": NESTED}
    msgs = [{"role": "user", "content": "hi"}]
    for max_tokens in (2**31 - 1, 16):
        err = _refused(lambda m=max_tokens: claude.messages.create(model=MODEL, max_tokens=m, messages=msgs,
                                                                   tools=[tool]), anthropic.BadRequestError)
        assert err.body["error"]["type"] == "invalid_request_error" and "pattern" in err.body["error"]["message"]
    err = _refused(lambda: claude.messages.count_tokens(model=MODEL, messages=msgs, tools=[tool]),
                   anthropic.BadRequestError)
    assert "pattern" in err.body["error"]["message"]
    assert claude.messages.count_tokens(model=MODEL, messages=msgs).input_tokens > 0
    r = httpx.post(f"{served.url}/tokenize", json={"model": MODEL, "messages": msgs, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": NESTED}}]}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "schema_too_large" and "pattern" in r.json()["error"]["message"]


def big_tool_schema(target_bytes: int) -> dict:
    props: dict = {}
    while len(json.dumps(props)) < target_bytes:
        field = {"type": "string", "description": "one field of a big tool " * 3}
        if len(props) < 100:  # patterns on the first 100: all of them would pass schema_max_output_chars' share
            field["pattern"] = "^[a-z]{1,8}$"
        props[f"field_{len(props)}"] = field
    return {"type": "object", "properties": props}


def _probe_health(url: str, stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(timeout=30) as http:
        while not stop.is_set():
            t = time.perf_counter()
            http.get(f"{url}/health")
            latencies.append(time.perf_counter() - t)
            time.sleep(0.02)


@pytest.mark.slow
def test_health_answers_while_300kb_tool_schemas_are_counted(served):
    schema = big_tool_schema(300 * 1024)
    msgs = [{"role": "user", "content": "hi"}]
    count_body = {"model": MODEL, "messages": msgs,
                  "tools": [{"name": "big", "description": "d", "input_schema": schema}]}
    tokenize_body = {"model": MODEL, "messages": msgs,
                     "tools": [{"type": "function", "function": {"name": "big", "parameters": schema}}]}

    def send(i: int) -> tuple[int, float]:
        t = time.perf_counter()
        path, body = ("/v1/messages/count_tokens", count_body) if i % 2 == 0 else ("/tokenize", tokenize_body)
        r = httpx.post(f"{served.url}{path}", json=body, timeout=300)
        return r.status_code, time.perf_counter() - t

    for path_round in range(2):  # count_tokens x3 (with a tokenize), then tokenize x3 (with a count)
        stop, latencies = threading.Event(), []
        probe = threading.Thread(target=_probe_health, args=(served.url, stop, latencies))
        probe.start()
        time.sleep(0.2)
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(send, [path_round, path_round + 2, path_round + 1]))
        stop.set()
        probe.join()
        worst = max(latencies)
        print(f"round {path_round}: requests {[(s, round(d, 2)) for s, d in results]}; /health n={len(latencies)} "
              f"p50={1000 * sorted(latencies)[len(latencies) // 2]:.1f} ms max={1000 * worst:.1f} ms")
        assert all(status == 200 for status, _ in results), results
        assert worst < 1.0, f"/health took {worst:.2f} s while tool schemas were checked"
        assert max(d for _, d in results) > worst  # the probe ran beside the work, not after it


def test_health_answers_while_a_tool_schema_is_counted(served):
    """The fast variant: one 100 KB tool schema to count_tokens, /health probed meanwhile."""
    schema = big_tool_schema(100 * 1024)
    stop, latencies = threading.Event(), []
    probe = threading.Thread(target=_probe_health, args=(served.url, stop, latencies))
    probe.start()
    time.sleep(0.1)
    t = time.perf_counter()
    r = httpx.post(f"{served.url}/v1/messages/count_tokens", timeout=300, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "big", "description": "d", "input_schema": schema}]})
    took = time.perf_counter() - t
    stop.set()
    probe.join()
    print(f"count_tokens {took:.2f} s; /health n={len(latencies)} max={1000 * max(latencies):.1f} ms")
    assert r.status_code == 200, r.text
    assert max(latencies) < 1.0


def test_logit_bias_over_300_entries_is_refused(client):
    bias = {str(i): 1 for i in range(301)}
    for call in (lambda: _chat(client, max_tokens=2, logit_bias=bias),
                 lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=2, logit_bias=bias)):
        err = _refused(call)
        assert err.param == "logit_bias" and "300" in err.message
    assert _chat(client, max_tokens=2, logit_bias={str(i): 1 for i in range(300)}).choices


def test_100k_prompts_are_refused_quickly(served):
    for prompt in (["a"] * 100_000, [[1]] * 100_000):
        t = time.perf_counter()
        r = httpx.post(f"{served.base_url}/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1},
                       timeout=60)
        took = time.perf_counter() - t
        print(f"100k prompts: {r.status_code} in {took * 1000:.0f} ms")
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        assert r.json()["error"]["code"] == "too_many_messages"
        assert took < 10  # milliseconds on a quiet box; generous for a loaded one
    # a list of 20,000 token ids is one prompt, not 20,000
    r = httpx.post(f"{served.base_url}/completions", json={"model": MODEL, "prompt": [1] * 20_000, "max_tokens": 1},
                   timeout=60)
    assert r.status_code != 400 or r.json()["error"].get("code") != "too_many_messages", r.text


def test_n_times_top_logprobs_is_bounded(client):
    err = _refused(lambda: _chat(client, max_tokens=2, n=128, logprobs=True, top_logprobs=20))
    assert err.param == "n"
    err = _refused(lambda: _chat(client, max_tokens=2, logprobs=True, top_logprobs=21))
    assert err.param == "top_logprobs"
    err = _refused(lambda: client.responses.create(model=MODEL, input="hi", top_logprobs=21))
    assert err.param == "top_logprobs"
    out = _chat(client, max_tokens=2, n=16, logprobs=True, top_logprobs=20)  # the largest allowed: 320 per token
    assert len(out.choices) == 16 and len(out.choices[0].logprobs.content[0].top_logprobs) == 20
