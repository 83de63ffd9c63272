"""The Messages API speaks Anthropic in every error, against a real ``tokenops serve`` (keyless, so
the browser guards run; the demo chat model), driven by httpx and the anthropic SDK:

- a body that is not JSON is a 415 in Anthropic's shape (it was OpenAI's), on both routes;
- another method is a 405 with ``Allow: POST`` in Anthropic's shape, also with a non-JSON body
  (``PUT`` answered 415: the guard took the catch-all route for a route of the method);
- a tool schema or output format the gateway refuses names ``tools[0].input_schema`` and
  ``output_config.format`` (the translation's ``tools[0].function.parameters`` and
  ``response_format`` used to leak into the message);
- a body nested too deeply is an Anthropic-shaped 400 (it was a 500).
"""

from __future__ import annotations

import anthropic
import httpx
import pytest
from tests.serve_configs import config as serve_config
from tests.serve_configs import local_model
from tokenops.engine.models.default_model import shipped_model_dir
from tokenops.testing_serve import ServeProcess

MODEL = "demo"
ROUTES = ("/v1/messages", "/v1/messages/count_tokens")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = serve_config(local_model(MODEL, shipped_model_dir()))
    with ServeProcess(tmp_path_factory.mktemp("messages-errors"), config=config, store=False) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(served):
    return anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=120)


def _anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert body["error"]["type"] == kind and isinstance(body["error"]["message"], str), body
    return body["error"]["message"]


def _message(**extra):
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize("path", ROUTES)
def test_a_body_that_is_not_json_is_an_anthropic_415(served, path):
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": content_type} if content_type else {}
        r = httpx.post(served.url + path, content=b'{"model": "demo"}', headers=headers, timeout=60)
        message = _anthropic_error(r, 415, "invalid_request_error")
        assert "application/json" in message


@pytest.mark.parametrize("path", ROUTES)
def test_other_methods_are_an_anthropic_405_with_allow(served, path):
    for method in ("GET", "PUT", "PATCH", "DELETE", "OPTIONS"):
        for content_type in ("text/plain", "application/json"):
            r = httpx.request(method, served.url + path, content=b"{}", headers={"content-type": content_type})
            message = _anthropic_error(r, 405, "invalid_request_error")
            assert r.headers["allow"] == "POST" and "POST" in message, (method, content_type)
    r = httpx.head(served.url + path)
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_an_unknown_messages_path_answers_in_anthropic_shape(served):
    r = httpx.post(served.url + "/v1/messages/batches", content=b"{}", headers={"content-type": "application/json"})
    _anthropic_error(r, 404, "not_found_error")
    r = httpx.post(served.url + "/v1/messages/batches", content=b"x", headers={"content-type": "text/plain"})
    _anthropic_error(r, 415, "invalid_request_error")  # no body of another type is read, even for a 404


def test_a_refused_tool_schema_names_input_schema(client):
    huge = {"type": "object", "properties": {"a": {"type": "string", "minLength": 1_000_000_000}}, "required": ["a"]}
    tool = {"name": "lookup", "description": "d", "input_schema": huge}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(**_message(tools=[tool], tool_choice={"type": "tool", "name": "lookup"}))
    message = e.value.body["error"]["message"]
    assert e.value.body["type"] == "error"
    assert "tools[0].input_schema" in message and "minLength" in message, message
    assert "function" not in message and "parameters" not in message, message
    with pytest.raises(anthropic.BadRequestError) as e:  # a schema the grammar cannot take
        bad = {"name": "lookup", "input_schema": {"type": "object", "properties": {"a": {"type": 5}}}}
        client.messages.create(**_message(tools=[bad]))
    message = e.value.body["error"]["message"]
    assert "input_schema" in message and "function.parameters" not in message, message


def test_a_refused_output_format_names_output_config(client):
    huge = {"type": "object", "properties": {"a": {"type": "string", "minLength": 1_000_000_000}}, "required": ["a"]}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(**_message(output_config={"format": {"type": "json_schema", "schema": huge}}))
    message = e.value.body["error"]["message"]
    assert message.startswith("output_config.format.schema: minLength"), message
    assert "response_format" not in message, message
    with pytest.raises(anthropic.BadRequestError) as e:  # count_tokens translates the same way
        client.messages.count_tokens(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"name": "t", "input_schema": {"type": "object", "properties": {"a": {"type": 5}}}}],
        )
    assert "function.parameters" not in e.value.body["error"]["message"]


@pytest.mark.parametrize("path", ROUTES)
def test_a_body_nested_too_deeply_is_an_anthropic_400(served, path):
    deep = '{"a":' * 20_000 + "1" + "}" * 20_000
    body = f'{{"model":"{MODEL}","max_tokens":4,"messages":[{{"role":"user","content":"hi"}}],"metadata":{deep}}}'
    r = httpx.post(served.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert "nested too deeply" in _anthropic_error(r, 400, "invalid_request_error")
