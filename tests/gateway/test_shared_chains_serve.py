"""Many gateways, one service (issue 54, first slice): two real ``tokenops serve`` processes with
the same ``[shared] postgres_url`` (the block copied from docs/scale-out.md, pointed at a
throwaway PostgreSQL from Debian's package) serve one set of stored ``/v1/responses``, driven by
the openai SDK: a chain started on A continues on B, is read and deleted on either, stays per
tenant, and keeps its byte bounds exactly as one process does.

Each gateway has its own DuckDB store (its own work folder): only PostgreSQL is shared. The demo
model answers the chain tests; the byte-bound test uses a chat-only upstream that echoes the last
message, so every turn's size is known and a one-process gateway can be asked the same turns.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import openai
import pytest

from tests.gateway.openai_upstream import Upstream
from tokenops.testing_postgres import PostgresUnavailable, postgres_server
from tokenops.testing_serve import ServeProcess

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tokenops" / "demo_models" / "target"
FILLER = 3000  # characters of input per bounded turn
ROW_BOUND, CHAIN_BOUND = 8000, 20000


def _shared_block(url: str) -> str:
    """The ``[shared]`` block of docs/scale-out.md with its URL replaced by ``url``."""
    text = (ROOT / "docs" / "scale-out.md").read_text()
    [block] = [b for b in re.findall(r"```toml\n(.*?)```", text, flags=re.S) if b.startswith("[shared]")]
    assert 'postgres_url = "' in block
    return re.sub(r'postgres_url = "[^"]*"', f'postgres_url = "{url}"', block)


def _config(upstream_url: str, *, demo: bool = True) -> str:
    models = f'[[models]]\nname = "up"\nbackend = "openai"\nurl = "{upstream_url}"\n\n'
    if demo:
        models += f'[[models]]\nname = "demo"\npath = "{DEMO}"\n\n'
    return (
        '[gateway]\napi_keys = { "key-a" = "team-a", "key-b" = "team-b" }\n'
        f"max_stored_response_bytes = {ROW_BOUND}\nmax_chain_bytes = {CHAIN_BOUND}\n\n{models}"
    )


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as up:
        yield up


@pytest.fixture(scope="module")
def gateways(tmp_path_factory, upstream):
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(postgres_server())
        except PostgresUnavailable as e:
            pytest.skip(str(e))
        config = _config(upstream.url) + _shared_block(url)
        a = stack.enter_context(ServeProcess(tmp_path_factory.mktemp("gateway_a"), config=config))
        b = stack.enter_context(ServeProcess(tmp_path_factory.mktemp("gateway_b"), config=config))
        yield a, b


def _client(srv: ServeProcess, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, timeout=120)


def test_a_chain_started_on_one_gateway_continues_on_the_other(gateways):
    a, b = (_client(s) for s in gateways)
    first = a.responses.create(model="demo", input="My name is Ada.", max_output_tokens=8, temperature=0)
    second = b.responses.create(model="demo", input="What is my name?", previous_response_id=first.id,
                                max_output_tokens=8, temperature=0)
    third = a.responses.create(model="demo", input="Say it again.", previous_response_id=second.id,
                               max_output_tokens=8, temperature=0)
    # the conversation each turn answered, read back on the other gateway: every earlier turn is in it
    items = b.responses.input_items.list(third.id, order="asc", limit=100).data
    users = [i.content[0].text for i in items if i.type == "message" and i.role == "user"]
    assert users == ["My name is Ada.", "What is my name?", "Say it again."]
    outputs = [i.id for i in items if i.type == "message" and i.role == "assistant"]
    assert outputs == [first.output[0].id, second.output[0].id]
    # GET on B of what A stored, and the other way round
    assert b.responses.retrieve(first.id).output_text == first.output_text
    assert a.responses.retrieve(second.id).id == second.id
    # a streamed turn on B is saved before its closing event: A continues from it at once
    events = list(b.responses.create(model="demo", input="Once more.", previous_response_id=third.id,
                                     max_output_tokens=4, temperature=0, stream=True))
    streamed = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete") and streamed.store
    fifth = a.responses.create(model="demo", input="Done.", previous_response_id=streamed.id, max_output_tokens=4)
    assert len(a.responses.input_items.list(fifth.id, limit=100).data) == len(items) + 2 + 1 + 1


def test_a_delete_on_one_gateway_is_seen_on_the_other(gateways):
    a, b = (_client(s) for s in gateways)
    r = a.responses.create(model="demo", input="Remember this.", max_output_tokens=4, temperature=0)
    assert b.responses.retrieve(r.id).id == r.id
    b.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        a.responses.retrieve(r.id)
    assert e.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError) as e:
        a.responses.create(model="demo", input="And now?", previous_response_id=r.id, max_output_tokens=4)
    assert e.value.body["param"] == "previous_response_id"


def test_another_tenant_gets_404_on_either_gateway(gateways):
    a, b = (_client(s) for s in gateways)
    r = a.responses.create(model="demo", input="Team A's secret.", max_output_tokens=4, temperature=0)
    for srv in gateways:
        other = _client(srv, "key-b")
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(r.id)
        with pytest.raises(openai.NotFoundError) as e:
            other.responses.create(model="demo", input="Go on.", previous_response_id=r.id, max_output_tokens=4)
        assert e.value.body["code"] == "previous_response_not_found"
        with pytest.raises(openai.NotFoundError):
            other.responses.delete(r.id)
    assert b.responses.retrieve(r.id).id == r.id  # still there for its own tenant


def _held(error: openai.BadRequestError) -> int:
    return int(error.body["message"].split(" holds ")[1].split(" bytes")[0])


def _turn(i: int) -> list[dict]:
    """FILLER characters, then a short last message: the upstream echoes only that."""
    return [{"role": "user", "content": "x" * FILLER}, {"role": "user", "content": f"turn {i}"}]


def _grow(clients: list[openai.OpenAI]) -> tuple[int, openai.BadRequestError, str]:
    """Turns of FILLER characters on ``clients`` in turn until one is refused: (turns kept, the
    refusal, the last id)."""
    previous = None
    for i in range(50):
        client = clients[i % len(clients)]
        try:
            r = client.responses.create(model="up", input=_turn(i), previous_response_id=previous)
        except openai.BadRequestError as e:
            return i, e, previous or ""
        assert r.output_text == f"echo: turn {i}" and r.store
        previous = r.id
    pytest.fail("no turn was refused")


def test_byte_bounds_hold_as_in_one_process(gateways, upstream, tmp_path):
    a, b = (_client(s) for s in gateways)
    kept, refused, last = _grow([a, b])
    assert refused.body["param"] == "previous_response_id" and refused.body["code"] == "chain_too_large"
    assert "max_chain_bytes" in refused.body["message"]
    # the same turn is refused on the other gateway too, from the same stored sums
    other = [a, b][(kept + 1) % 2]
    with pytest.raises(openai.BadRequestError) as again:
        other.responses.create(model="up", input=_turn(kept), previous_response_id=last)
    assert again.value.body["code"] == "chain_too_large" and _held(again.value) == _held(refused)
    # a row past max_stored_response_bytes is refused on either gateway
    for client in (a, b):
        with pytest.raises(openai.BadRequestError) as big:
            client.responses.create(model="up", input="y" * ROW_BOUND)
        assert big.value.body["code"] == "stored_response_too_large" and big.value.body["param"] == "input"
    # one gateway alone, its own embedded store: the same turns stop at the same turn, the same bytes
    with ServeProcess(tmp_path / "alone", config=_config(upstream.url, demo=False)) as alone:
        kept_alone, refused_alone, _ = _grow([_client(alone)])
    assert kept_alone == kept and _held(refused_alone) == _held(refused)
