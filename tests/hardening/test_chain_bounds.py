"""Hardening III, stored chains (issue 51): ``previous_response_id`` chains are stored as links
(each turn's own items once), bounded in bytes per response and per chain, and counted against
``[gateway] max_messages``; field caps equal across APIs (``metadata``, ``max_output_tokens``).

Against a real ``tokenops serve``, driven by the openai and anthropic SDKs. Long inputs go to a
chat-only OpenAI-compatible upstream (tests/gateway/openai_upstream.py: it echoes the last
message, whatever the prompt's size); the bundled demo model answers where the prompt is short.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.gateway.openai_upstream import Upstream
from tokenops.testing_serve import ServeProcess

DEMO = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"
BIG = 200 * 1024  # bytes of text per turn
CHAIN_BOUND = 2_500_000


def _config(upstream_url: str, gateway: str) -> str:
    return (
        f"[gateway]\n{gateway}\n"
        f'[[models]]\nname = "up"\nbackend = "openai"\nurl = "{upstream_url}"\n\n'
        f'[[models]]\nname = "demo"\npath = "{DEMO}"\n'
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with Upstream() as up:
        config = _config(up.url, f"max_chain_bytes = {CHAIN_BOUND}\n")
        with ServeProcess(tmp_path_factory.mktemp("chains"), config=config) as srv:
            yield up, srv


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1].base_url, api_key="unused", max_retries=0, timeout=120)


def _turn(i: int, filler: str) -> list[dict]:
    return [{"role": "user", "content": filler}, {"role": "user", "content": f"turn {i}"}]


def test_a_chain_stores_each_turn_once_and_stops_at_its_bound(served, client):
    up, _ = served
    filler = "x" * BIG
    previous, turns = None, []
    for i in range(20):
        try:
            r = client.responses.create(model="up", input=_turn(i, filler), previous_response_id=previous)
        except openai.BadRequestError as e:
            refused = e.body
            break
        assert r.output_text == f"echo: turn {i}"
        sent = up.bodies[-1]["messages"]
        assert len(sent) == 3 * i + 2  # the whole conversation reached the model: 2 inputs + 1 answer per turn
        up.bodies.clear()
        previous = r.id
        turns.append(r.id)
    else:
        pytest.fail("no turn was refused")
    # refused before it ran, naming the bound; the chain held ~BIG bytes per turn, not the sum of
    # every earlier turn per row (the copy the chain used to be stored as grew quadratically)
    assert refused["param"] == "previous_response_id" and refused["code"] == "chain_too_large"
    assert "max_chain_bytes" in refused["message"] and "new chain" in refused["message"]
    assert 11 <= len(turns) <= 12  # 2.5 MB / (BIG + ~2 kB of ids and Response per turn)
    held = int(refused["message"].split(" holds ")[1].split(" bytes")[0])
    assert len(turns) * BIG < held < len(turns) * (BIG + 4096)
    items = client.responses.input_items.list(turns[-1], order="asc", limit=100).data
    assert len(items) == 3 * len(turns) - 1 and items[-1].content[0].text == f"turn {len(turns) - 1}"

    # what the error advises works: a new chain
    assert client.responses.create(model="up", input="again").output_text == "echo: again"


def test_one_response_past_its_bound_is_refused_unless_not_stored(client):
    big = "y" * (1024 * 1024 + 1)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="up", input=big)
    assert e.value.body["param"] == "input" and e.value.body["code"] == "stored_response_too_large"
    assert "max_stored_response_bytes" in e.value.body["message"] and "store: false" in e.value.body["message"]
    r = client.responses.create(model="up", input=big, store=False)
    assert r.store is False and r.output_text.startswith("echo: yyy")


def test_items_the_model_never_reads_are_not_stored_verbatim(client):
    secret = "z" * (1024 * 1024 + 1)  # alone past max_stored_response_bytes, were it stored
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s" * 1000}],
                 "encrypted_content": secret}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "padding": secret}
    output = {"type": "function_call_output", "call_id": "c1", "output": "4"}
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    r = client.responses.create(model="demo", input=[reasoning, {"role": "user", "content": "hi"}, call, output],
                                tools=[tool], max_output_tokens=16)
    items = client.responses.input_items.list(r.id, order="asc").data
    assert [i.type for i in items] == ["reasoning", "message", "function_call", "function_call_output"]
    stored_reasoning, stored_call = items[0].model_dump(), items[2].model_dump()
    assert stored_reasoning["id"] == "rs_1" and stored_reasoning["summary"] == []
    assert not stored_reasoning.get("encrypted_content") and "padding" not in stored_call
    assert stored_call["arguments"] == "{}" and items[3].output == "4"


def test_input_items_count_against_max_messages_with_the_chain(served, client):
    # httpx: the openai SDK spends ~90 s of its own converting 100,000 items before it sends them
    body = json.dumps({"model": "up", "input": [{"role": "user", "content": "x"}] * 100_000}).encode()
    started = time.monotonic()
    r = httpx.post(f"{served[1].base_url}/responses", content=body, headers={"content-type": "application/json"},
                   timeout=120)
    elapsed = time.monotonic() - started
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "too_many_messages" and error["param"] == "input"
    assert "100000 input items" in error["message"] and "max_messages" in error["message"]
    assert elapsed < 10  # counted before parsing (0.3 s here on a loaded box)

    first = client.responses.create(model="up", input=[{"role": "user", "content": "x"}] * 6000)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="up", previous_response_id=first.id, input=[{"role": "user", "content": "y"}] * 4000)
    body = e.value.body
    assert body["code"] == "too_many_messages" and body["param"] == "input"
    assert "6001 from previous_response_id and 4000 new" in body["message"] and "new chain" in body["message"]
    second = client.responses.create(model="up", previous_response_id=first.id, input=[{"role": "user", "content": "y"}] * 3000)
    assert second.previous_response_id == first.id


def test_messages_content_blocks_count_against_max_messages(served):
    client = anthropic.Anthropic(base_url=served[1].url, api_key="unused", max_retries=0, timeout=120)
    blocks = [{"type": "text", "text": "x"}] * 10_001
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="demo", max_tokens=4, messages=[{"role": "user", "content": blocks}])
    assert e.value.status_code == 400 and "10001 content blocks" in e.value.body["error"]["message"]
    assert "max_messages" in e.value.body["error"]["message"]
    few = [{"type": "text", "text": "x"}] * 3  # small bodies are counted after parsing, the same rule
    assert client.messages.create(model="demo", max_tokens=2, messages=[{"role": "user", "content": few}]).content


@pytest.mark.parametrize("kwargs, param", [
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 600}}, "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "metadata"),
    ({"max_output_tokens": 10**12}, "max_output_tokens"),
])
def test_field_caps_name_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="demo", input="hi", **kwargs)
    assert e.value.body["param"] == param, e.value.body


def test_field_caps_are_inclusive(client):
    r = client.responses.create(model="demo", input="hi", max_output_tokens=2,
                                metadata={f"k{i:062}": "v" * 512 for i in range(16)})
    assert len(r.metadata) == 16 and client.responses.retrieve(r.id).metadata == r.metadata


def test_chat_metadata_has_the_same_caps(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="up", messages=[{"role": "user", "content": "hi"}],
                                       metadata={f"k{i}": "v" for i in range(17)})
    assert e.value.body["param"] == "metadata"
    ok = client.chat.completions.create(model="up", messages=[{"role": "user", "content": "hi"}], metadata={"k": "v"})
    assert ok.choices[0].message.content == "echo: hi"


def test_a_deleted_turn_stays_a_link_of_later_turns(client):
    r1 = client.responses.create(model="up", input="one")
    r2 = client.responses.create(model="up", input="two", previous_response_id=r1.id)
    client.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r1.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="up", input="x", previous_response_id=r1.id)
    r3 = client.responses.create(model="up", input="three", previous_response_id=r2.id)
    texts = [i.content[0].text for i in client.responses.input_items.list(r3.id, order="asc").data]
    assert texts == ["one", "echo: one", "two", "echo: two", "three"]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_forty_turns_of_200_kb_keep_memory_and_rows_flat(tmp_path):
    """The audit's case: 40 turns, ~200 KB each. RSS grows < 256 MiB; every stored row is one
    turn's size; the turn past ``max_chain_bytes`` is a 400 and the client starts a new chain."""
    import duckdb

    bound = 6 * 1024 * 1024
    with Upstream() as up, ServeProcess(tmp_path, config=_config(up.url, f"max_chain_bytes = {bound}\n")) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
        filler = "w" * BIG
        client.responses.create(model="up", input="warm up")
        start = _rss_mib(srv.proc.pid)
        previous, refused, peak = None, [], start
        for i in range(40):
            try:
                r = client.responses.create(model="up", input=_turn(i, filler), previous_response_id=previous)
                previous = r.id
            except openai.BadRequestError as e:
                assert e.body["code"] == "chain_too_large" and "max_chain_bytes" in e.body["message"]
                refused.append(i)
                previous = None  # as the error says: a new chain
            up.bodies.clear()
            peak = max(peak, _rss_mib(srv.proc.pid))
        print(f"RSS {start:.0f} MiB -> peak {peak:.0f} MiB over 40 turns; refused at turns {refused}")
        assert peak - start < 256
        assert len(refused) == 1 and 25 <= refused[0] <= 32  # 6 MiB / ~205 kB per turn
        srv.stop()
    con = duckdb.connect(str(srv.store_path), read_only=True)
    sizes = [r[0] for r in con.execute("SELECT num_bytes FROM stored_responses WHERE num_bytes > ? ORDER BY created_at",
                                       [BIG]).fetchall()]
    con.close()
    assert len(sizes) == 39  # every turn but the refused one
    assert max(sizes) - min(sizes) < 2048, (min(sizes), max(sizes))  # one turn each, not the chain so far
