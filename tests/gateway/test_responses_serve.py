"""``/v1/responses`` through a real ``tokenops serve`` (the demo model), driven by the
openai SDK: created streamed and not, a conversation by ``previous_response_id``, stored
responses read, listed and deleted per tenant, 400s naming fields, the request in
``tokenops report``.

The demo model writes word salad: what is asserted is the API's shape and behaviour
(forced tool calls validate because decoding is grammar-constrained).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from pydantic import TypeAdapter

from tokenops.testing_serve import ServeProcess

DEMO = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"
REASONER = DEMO.parent / "reasoning-small"
CONFIG = f"""
[gateway]
api_keys = {{ "key-a" = "team-a", "key-b" = "team-b" }}

[[models]]
name = "demo"
path = "{DEMO}"
cost_input_per_1m = 1000.0
cost_output_per_1m = 2000.0

[[models]]
name = "reasoner"
path = "{REASONER}"
reasoning_parser = "think"
"""
ADD = {"type": "function", "name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("responses"), config=CONFIG) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="key-a", max_retries=0)


@pytest.fixture(scope="module")
def other(server):
    return openai.OpenAI(base_url=server.base_url, api_key="key-b", max_retries=0)


def test_create_returns_a_typed_response_with_usage(client):
    from openai.types.responses import Response

    raw = client.responses.with_raw_response.create(model="demo", instructions="Be brief.", input="Hello!",
                                                    max_output_tokens=12, temperature=0)
    body = json.loads(raw.text)
    r = Response.model_validate(body)  # validated, not merely constructed
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "demo"
    assert r.status in ("completed", "incomplete") and r.store is True and r.instructions == "Be brief."
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def _events(stream) -> list:
    from openai.types.responses import ResponseStreamEvent

    adapter = TypeAdapter(ResponseStreamEvent)
    events = list(stream)
    for e in events:
        adapter.validate_python(e.to_dict())  # every event is a valid member of the SDK's typed union
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def test_stream_sends_openai_events_in_order(client):
    events = _events(client.responses.create(model="demo", input="Tell me a story.", max_output_tokens=300,
                                             stream=True))
    kinds = [e.type for e in events]
    deltas = [i for i, k in enumerate(kinds) if k == "response.output_text.delta"]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert deltas == list(range(4, 4 + len(deltas))) and deltas
    assert kinds[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", kinds[-1]]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    final = events[-1].response
    text = "".join(events[i].delta for i in deltas)
    assert final.output_text == text == events[4 + len(deltas)].text and final.usage.output_tokens > 0


def test_stream_ends_with_the_decisions_known_at_its_end(client):
    """Issue 37: ``response.completed`` carries the x-tokenops-* values (the cost is known only at
    the end) beside the Response, an extra key the openai SDK keeps; the stored Response is without it."""
    raw = client.responses.with_raw_response.create(model="demo", input="Hi", max_output_tokens=6, stream=True)
    events = _events(raw.parse())
    decisions = events[-1].model_extra["tokenops"]
    assert "x-tokenops-cost-usd" not in raw.headers and events[-1].response.usage.output_tokens > 0
    assert decisions["model"] == raw.headers["x-tokenops-model"] == "demo"
    assert decisions["replica"] == raw.headers["x-tokenops-replica"] and decisions["cost_usd"] > 0
    assert all("tokenops" not in (e.model_extra or {}) for e in events[:-1])
    stored = client.responses.retrieve(events[-1].response.id)
    assert stored.output_text == events[-1].response.output_text and "tokenops" not in (stored.model_extra or {})


def test_sdk_stream_helper_accumulates_the_answer(client):
    # A schema that closes after a few tokens, so the answer always ends before the cap (a sampled
    # free-text answer of the toy model sometimes runs to it and ends as response.incomplete).
    answer = {"type": "json_schema", "name": "answer", "strict": True,
              "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                         "additionalProperties": False}}
    with client.responses.stream(model="demo", input="Hi", max_output_tokens=400, text={"format": answer}) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(texts) and final.status == "completed"


def test_forced_function_call_streams_argument_deltas(client):
    events = _events(client.responses.create(model="demo", input="Add 2 and 3.", tools=[ADD], tool_choice="required",
                                             max_output_tokens=64, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.content_part.added" not in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    [call] = events[-1].response.output
    assert call.type == "function_call" and call.name == "add" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == json.loads(done.arguments) and set(json.loads(call.arguments)) == {"a", "b"}


def test_tool_round_trip_with_function_call_output(client):
    first = client.responses.create(model="demo", input="Add 2 and 3.", tools=[ADD],
                                    tool_choice={"type": "function", "name": "add"}, max_output_tokens=64)
    [call] = first.output
    second = client.responses.create(model="demo", previous_response_id=first.id, tools=[ADD], max_output_tokens=8,
                                     input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}])
    kinds = [i.type for i in client.responses.input_items.list(second.id, order="asc").data]
    assert kinds == ["message", "function_call", "function_call_output"]
    assert second.usage.input_tokens > first.usage.input_tokens


def test_three_turns_by_previous_response_id_and_tenant_isolation(client, other):
    r1 = client.responses.create(model="demo", input="My name is Ada.", max_output_tokens=8)
    r2 = client.responses.create(model="demo", input="What is my name?", previous_response_id=r1.id, max_output_tokens=8)
    r3 = client.responses.create(model="demo", input="Say it again.", previous_response_id=r2.id, max_output_tokens=8)
    assert r3.previous_response_id == r2.id
    assert r1.usage.input_tokens < r2.usage.input_tokens < r3.usage.input_tokens
    items = client.responses.input_items.list(r3.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant")] * 2 + [("message", "user")]
    assert items[0].content[0].text == "My name is Ada." and items[1].content[0].text == r1.output_text
    assert client.responses.retrieve(r2.id).output_text == r2.output_text

    # another tenant: the id does not exist for it, whatever it tries
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r1.id)
    with pytest.raises(openai.NotFoundError) as e:
        other.responses.create(model="demo", input="x", previous_response_id=r1.id, max_output_tokens=4)
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(r1.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(r1.id)

    client.responses.delete(r1.id)  # a later turn keeps its whole conversation
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r1.id)
    assert len(client.responses.input_items.list(r3.id).data) == 5


def test_store_false_is_not_kept(client):
    r = client.responses.create(model="demo", input="x", store=False, max_output_tokens=4)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


@pytest.mark.parametrize("kwargs, param", [
    ({"extra_body": {"bogus": 1}}, "bogus"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0].type"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "required": 3}}}},
     "text.format.schema"),
    ({"temperature": 5}, "temperature"),
])
def test_unsupported_fields_are_400s_naming_them(client, kwargs, param):
    kwargs.setdefault("input", "hello")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="demo", max_output_tokens=4, **kwargs)
    assert e.value.body["param"] == param, e.value.body


def test_json_schema_text_format_is_enforced(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.responses.create(model="demo", input="A person.", max_output_tokens=64,
                                text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    assert set(json.loads(r.output_text)) == {"name", "age"}


def test_logprobs_are_included_when_asked(client):
    r = client.responses.create(model="demo", input="Hi", max_output_tokens=6, top_logprobs=2,
                                include=["message.output_text.logprobs"])
    [part] = r.output[0].content
    assert len(part.logprobs) == r.usage.output_tokens and all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    assert "".join(lp.token for lp in part.logprobs) == part.text


def test_reasoning_models_answer_with_reasoning_items(client):
    from tokenops_plugins.model_optimization._reasoning_tasks import make_reasoning_suite

    prompt = make_reasoning_suite("multistep", 1, seed=0, terms=(5, 5))[0].prompt
    r = client.responses.create(model="reasoner", input=prompt, max_output_tokens=160, temperature=0)
    assert [i.type for i in r.output] == ["reasoning", "message"] and r.output[0].content[0].text
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = _events(client.responses.create(model="reasoner", input=prompt, max_output_tokens=160, temperature=0,
                                             stream=True))
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.reasoning_text.done") \
        < kinds.index("response.output_text.delta")
    assert events[-1].response.output[0].content[0].text == r.output[0].content[0].text
    short = client.responses.create(model="reasoner", input=prompt, max_output_tokens=160, temperature=0,
                                    reasoning={"effort": "minimal"})  # thinking budget 0
    assert short.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens_details.reasoning_tokens
    # a model that does not think is within any effort (Codex sends one to every model): accepted
    plain = client.responses.create(model="demo", input="x", reasoning={"effort": "low", "summary": "auto"},
                                    max_output_tokens=4)
    assert plain.usage.output_tokens_details.reasoning_tokens == 0
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="demo", input="x", reasoning={"effort": "huge"}, max_output_tokens=4)
    assert e.value.body["param"] == "reasoning.effort" and "huge" in e.value.body["message"]


def test_deleting_a_tenant_purges_its_stored_responses(server, client):
    import httpx

    admin = httpx.Client(base_url=server.url, headers=server.admin_headers, timeout=30)
    assert admin.put("/admin/tenants/acme", json={}).status_code == 201
    key = admin.post("/admin/keys", json={"tenant": "acme"}).json()["key"]
    acme = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    for _ in range(2):
        acme.responses.create(model="demo", input="x", max_output_tokens=2)
    kept = client.responses.create(model="demo", input="x", max_output_tokens=2)
    r = admin.delete("/admin/tenants/acme")
    assert r.status_code == 200 and r.json()["purged"]["stored_responses"] == 2
    assert client.responses.retrieve(kept.id).id == kept.id  # another tenant's stay


def test_requests_appear_in_report_with_tokens_and_cost(server, client):
    client.responses.create(model="demo", input="count me", max_output_tokens=4)
    server.stop()
    out = subprocess.run([sys.executable, "-m", "tokenops", "report", "--json", "--since", "all", "--by", "tenant",
                          "--store", str(server.store_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    table = report["usage_by_model_day"]
    [row] = [dict(zip(table["columns"], r)) for r in table["rows"] if r[table["columns"].index("model")] == "demo"]
    assert row["requests"] >= 1 and row["tokens_in"] > 0 and row["tokens_out"] > 0 and row["cost_usd"] > 0
    spend = report["spend_by_tenant"]
    assert any(r[0] == "team-a" and r[-1] > 0 for r in spend["rows"])
    import duckdb

    con = duckdb.connect(str(server.store_path), read_only=True)
    rows = con.execute("SELECT tokens_in, tokens_out, cost_usd FROM requests WHERE tenant = 'team-a' "
                       "AND model_served = 'demo' AND http_status = 200 AND json_extract_string(decisions, '$.api') = 'responses'").fetchall()
    con.close()
    assert rows and all(t_in > 0 and t_out > 0 and cost > 0 for t_in, t_out, cost in rows)
