"""Property-based fuzzing of the OpenAI endpoints and the tunables API (issue 17).

Whatever a client sends, the server answers below 500, and every error is an
OpenAI-shaped JSON error. Bodies are generated from the request schema (valid
fields, wrong types, lone surrogates, NaN, huge numbers, deep nesting, unknown
fields, non-objects) plus raw bytes and odd content types.

The default run makes ``TOKENOPS_FUZZ_EXAMPLES`` examples per test (default 120, a
few seconds each); the slow variant (``make test-all``) makes 20x as many.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from tokenops.gateway.app import create_app
from tokenops.gateway.auth import hash_key
from tokenops.testing_gateway import FakeBackend

EXAMPLES = int(os.environ.get("TOKENOPS_FUZZ_EXAMPLES", "120"))
ADMIN = {"X-Admin-Key": "fuzz"}

text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)  # lone surrogates included
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                    st.floats(allow_nan=True, allow_infinity=True), text)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(text, inner, max_size=4)), max_leaves=12)
roles = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"]), text)
parts = st.lists(st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(text, json_values)}),
                           st.dictionaries(text, json_values, max_size=3)), max_size=3)
messages = st.lists(st.fixed_dictionaries({"role": roles}, optional={
    "content": st.one_of(text, parts, json_values), "name": st.one_of(text, json_values),
    "tool_calls": json_values}), max_size=4)
common = {
    "model": st.one_of(st.just("fake-model"), text, json_values),
    "max_tokens": st.one_of(st.integers(-5, 10**12), json_values),
    "temperature": st.one_of(st.floats(-1, 3), json_values),
    "top_p": st.one_of(st.floats(-1, 2), json_values),
    "n": st.one_of(st.integers(-1, 20), json_values),
    "stop": st.one_of(text, st.lists(text, max_size=3), json_values),
    "stream": st.one_of(st.booleans(), json_values),
    "stream_options": json_values,
    "seed": st.one_of(st.integers(-(2**70), 2**70), json_values),
    "user": st.one_of(text, json_values),
    "logprobs": json_values,
    "top_logprobs": json_values,
    "frequency_penalty": st.one_of(st.floats(-3, 3), json_values),
    "presence_penalty": st.one_of(st.floats(allow_nan=True), json_values),
    "repetition_penalty": st.one_of(st.floats(-1, 3), json_values),
    "logit_bias": st.one_of(st.dictionaries(st.one_of(text, st.integers(-5, 10**20).map(str)),
                                            st.one_of(st.floats(-200, 200), json_values), max_size=3), json_values),
    "min_tokens": st.one_of(st.integers(-5, 100), json_values),
}
hostile_chat = st.fixed_dictionaries({"model": common["model"], "messages": st.one_of(messages, json_values)},
                                     optional={**{k: v for k, v in common.items() if k != "model"},
                                               "extra_field": json_values})
# well-typed bodies with edge values, so the pipeline behind validation is fuzzed too
plain = st.text(max_size=60)
valid_chat = st.fixed_dictionaries({"model": st.just("fake-model"), "messages": st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant"]),
    "content": st.one_of(plain, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": plain}),
                                         min_size=1, max_size=3))}), min_size=1, max_size=4)}, optional={
    "max_tokens": st.integers(1, 64), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
    "n": st.integers(1, 3), "stop": st.one_of(plain, st.lists(plain, max_size=3)), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "seed": st.integers(0, 2**31),
    "user": plain, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5), "extra_field": json_values})
chat_bodies = st.one_of(valid_chat, hostile_chat)
completion_bodies = st.fixed_dictionaries({"model": common["model"], "prompt": st.one_of(
    text, st.lists(st.integers(-5, 10**6), max_size=5), json_values)}, optional={
    **{k: v for k, v in common.items() if k != "model"}, "echo": json_values, "suffix": json_values})


def _dump(body) -> bytes:
    # NaN/Infinity and lone surrogates become JSON the way a sloppy client would send them
    return json.dumps(body, allow_nan=True).encode()


raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.integers(1, 3000).map(lambda depth: b'{"model": "fake-model", "messages": ' + b"[" * depth + b"]" * depth + b"}"),
    json_values.map(_dump),
)
content_types = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", "", "x/y"])


@pytest.fixture(scope="module")
def client():
    app = create_app(None, [FakeBackend()], admin_key_hash=hash_key("fuzz"))
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as c:
        yield c


def _check(r) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert {"type", "param", "code"} <= set(err)
        assert "Traceback" not in err["message"]
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        assert '"error"' not in r.text and r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]


def _post(client, path: str, content: bytes, content_type: str = "application/json"):
    headers = {"content-type": content_type} if content_type else {}
    return client.post(path, content=content, headers=headers)


def _fuzz(examples: int):
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))


@_fuzz(EXAMPLES)
@given(body=chat_bodies)
def test_chat_completions_never_5xx(client, body):
    _check(_post(client, "/v1/chat/completions", _dump(body)))


@_fuzz(EXAMPLES)
@given(body=completion_bodies)
def test_completions_never_5xx(client, body):
    _check(_post(client, "/v1/completions", _dump(body)))


@_fuzz(EXAMPLES)
@given(raw=raw_bodies, content_type=content_types, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_raw_bodies_never_5xx(client, raw, content_type, path):
    _check(_post(client, path, raw, content_type))


@_fuzz(EXAMPLES)
@given(values=st.dictionaries(st.sampled_from(["breaker.failure_rate", "breaker.cooldown_s", "breaker.window_s",
                                               "breaker.consecutive_failures", "engine.max_num_seqs",
                                               "ratelimit.tenant_requests_per_min", "nonexistent"]) | text,
                              json_values, min_size=1, max_size=3))
def test_tunables_patch_never_5xx_and_never_stores_a_non_finite_value(client, values):
    r = client.patch("/admin/tunables", content=_dump({"values": values}),
                     headers={**ADMIN, "content-type": "application/json"})
    _check(r)
    for t in client.get("/admin/tunables", headers=ADMIN).json()["tunables"]:
        if isinstance(t["value"], float):
            assert math.isfinite(t["value"]), t


@pytest.mark.slow
@_fuzz(EXAMPLES * 20)
@given(body=chat_bodies)
def test_chat_completions_never_5xx_long(client, body):
    _check(_post(client, "/v1/chat/completions", _dump(body)))
