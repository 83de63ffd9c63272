"""Issue 42 against a real ``tokenops serve`` (the demo chat model; the gateway is what is
tested): schemas that size or multiply the answer get a 400 naming the keyword before any
work, a self-referencing schema is a 400 without internals, a recursive schema that can
end works, the validation gaps are closed, admin bodies and parameters are range-checked,
and ``/metrics`` needs a key. The hostile client (tests/benchmarks/hostile_client.py)
loops over its cases once: every one is a 4xx, never a 5xx."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.serve_configs import config as serve_config, local_model, section
from tokenops.engine.models.default_model import shipped_model_dir
from tokenops.testing_serve import ServeProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import hostile_client  # noqa: E402

API_KEY, ADMIN_KEY = "h2-api-key-123", "h2-admin-key-123"
MODEL = "demo"  # the demo chat model (the gateway is under test); one constant to switch


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = serve_config(
        local_model(MODEL, shipped_model_dir()),
        section("gateway", api_keys={API_KEY: "acme"}, metrics_key="prom-scrape-key"),
    )
    with ServeProcess(tmp_path_factory.mktemp("hardening2"), config=config, admin_key=ADMIN_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0)


def _format(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def _refused(call) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    return e.value


def _ask(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          **{"max_tokens": 32, **kw})


def test_sizing_keywords_are_refused_naming_the_keyword(client):
    huge = _refused(lambda: _ask(client, response_format=_format({"type": "string", "minLength": 1_000_000_000})))
    assert huge.param == "response_format.json_schema.schema" and "minLength" in huge.message
    nested = {"type": "array", "minItems": 3000, "items": {"type": "array", "minItems": 3000, "items": {}}}
    assert "minItems" in _refused(lambda: _ask(client, response_format=_format(nested))).message
    # within the server's ceiling but not within this request's max_tokens
    long = _refused(lambda: _ask(client, max_tokens=16, response_format=_format(
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 2000}}, "required": ["a"]})))
    assert "max_tokens=16" in long.message and "minLength" in long.message
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "minLength": 5_000_000}}, "required": ["a"]}}}
    forced = _refused(lambda: _ask(client, tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}}))
    assert forced.param == "tools[0].function.parameters" and "minLength" in forced.message
    enum = _refused(lambda: _ask(client, response_format=_format({"enum": list(range(100_000))})))
    assert "enum" in enum.message


def test_self_reference_is_a_400_without_internals_and_bounded_recursion_works(client):
    self_ref = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}
    for kw in ({"response_format": _format(self_ref)},
               {"tools": [{"type": "function", "function": {"name": "f", "parameters": self_ref}}],
                "tool_choice": "required"}):
        e = _refused(lambda: _ask(client, **kw))
        assert "$ref" in e.message and "required inside itself" in e.message
        assert "Too many items" not in e.message and "engine error" not in e.message
    tree = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                             "child": {"$ref": "#"}}, "required": ["name"]}
    answer = _ask(client, max_tokens=48, response_format=_format(tree))
    parsed = json.loads(answer.choices[0].message.content)  # the budget-aware close ends it as JSON
    assert isinstance(parsed, dict) and "name" in parsed


def test_validation_gaps_are_closed(client):
    assert _refused(lambda: _ask(client, seed=2**64 + 1)).param == "seed"
    assert _refused(lambda: _ask(client, extra_body={"cache": "yes"})).param == "cache"
    e = _refused(lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user"}], max_tokens=4))
    assert e.param == "messages.0.content"
    assert _ask(client, seed=2**63 - 1, max_tokens=2, extra_body={"cache": False}).choices


def test_admin_bodies_and_parameters_are_range_checked(served):
    admin = httpx.Client(base_url=served.url, headers={"x-admin-key": ADMIN_KEY}, timeout=60)
    deep = b'{"budget_usd": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    r = admin.put("/admin/tenants/deep", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    big = b'{"tenant": "acme", "rpm": ' + b"9" * 4300 + b"}"
    assert admin.post("/admin/keys", content=big, headers={"content-type": "application/json"}).status_code == 400
    r = admin.post("/admin/keys", content=b'{"tenant": "acme", "rpm": 18446744073709551616}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "rpm"
    for since in ("999999999999d", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        r = admin.get("/admin/query/usage_by_model_day", params={"since": since})
        assert r.status_code == 400 and "since" in r.json()["error"]["message"], r.text
    assert admin.get("/admin/query/usage_by_model_day", params={"since": "7d"}).status_code == 200
    assert admin.get("/admin/requests", params={"limit": 0}).status_code == 400


def test_metrics_need_the_admin_or_the_metrics_key(served):
    assert httpx.get(f"{served.url}/metrics").status_code == 401
    assert httpx.get(f"{served.url}/metrics", headers={"authorization": f"Bearer {API_KEY}"}).status_code == 401
    for key in (ADMIN_KEY, "prom-scrape-key"):  # Prometheus sends its bearer_token this way
        r = httpx.get(f"{served.url}/metrics", headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")


def test_every_hostile_case_is_a_4xx(served):
    with httpx.Client(base_url=served.url, timeout=120) as c:
        hostile_client.API_KEY, hostile_client.ADMIN_KEY = API_KEY, ADMIN_KEY
        codes = {name: hostile_client._send(c, name) for name in hostile_client.CASES}
    # no embedding model here: those cases are a 4xx too, refused before any work
    assert all(400 <= code < 500 for code in codes.values()), codes
