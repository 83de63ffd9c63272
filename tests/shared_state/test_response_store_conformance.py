"""The shared-state seam (tokenops/shared_state/): both stored-responses implementations keep the
same semantics and bounds. One scenario (chains as links, tenants, byte bounds, deletes that
leave hidden links, eviction by count and age, purge) runs against the embedded DuckDB store and
against PostgreSQL (a real server from Debian's package: ``make postgres``), and what each call
returned must be equal, byte counts included."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tokenops.shared_settings import SharedSettings
from tokenops.shared_state import ResponseStore, open_response_store
from tokenops.shared_state.postgres_responses import PostgresResponseStore
from tokenops.store import Store
from tokenops.store.migrations import utcnow
from tokenops.store.stored_responses import Limits
from tokenops.testing_postgres import PostgresUnavailable, new_database, postgres_server

LIMITS = Limits(max_per_tenant=4, max_response_bytes=900, max_chain_bytes=4000)
_names = itertools.count()


@pytest.fixture(scope="module")
def server():
    try:
        with postgres_server() as url:
            yield url
    except PostgresUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def postgres(server):
    url = new_database(server, f"conformance_{next(_names)}")  # a fresh database per test
    rs = open_response_store(SharedSettings(postgres_url=url), LIMITS)
    assert isinstance(rs, PostgresResponseStore)
    yield rs
    rs.close()


@pytest.fixture
def embedded(tmp_path):
    store = Store.open(tmp_path / "t.duckdb")
    rs = open_response_store(SharedSettings(), LIMITS, store)
    yield rs
    store.close()


def _age(rs: Any, response_id: str, hours: float) -> None:
    when = utcnow() - timedelta(hours=hours)
    sql = "UPDATE stored_responses SET created_at = {} WHERE id = {}"
    if isinstance(rs, PostgresResponseStore):
        with rs.engine.begin() as con:
            con.execute(sa.text(sql.format(":t", ":id")), {"t": when, "id": response_id})
    else:
        rs.store.execute(sql.format("?", "?"), [when, response_id])


def _turn(rs: ResponseStore, tenant: str, rid: str, prev: str | None, text: str, history: list) -> bool:
    """One turn as the Responses route saves it: the whole conversation, of which ``history`` came
    from ``prev``."""
    response = {"id": rid, "model": "m", "output": [{"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": f"answer to {text}"}]}]}
    own = [{"type": "message", "role": "user", "content": text}]
    return rs.save(tenant, response, history + own, prev, len(history))


def _observe(rs: ResponseStore, tenant: str, ids: list[str]) -> list[Any]:
    """Everything a reader sees of ``ids`` (created_at left out: the two runs differ in time)."""
    out: list[Any] = [rs.count(), rs.count(tenant), rs.row_sizes(tenant)]
    for rid in ids:
        got = rs.get(tenant, rid)
        out.append(rs.head(tenant, rid))
        out.append(rs.response(tenant, rid))
        out.append(rs.conversation(tenant, rid))
        out.append(None if got is None else (got.id, got.tenant, got.model, got.previous_response_id,
                                              got.input_items, got.response))
    return out


def _scenario(rs: ResponseStore) -> tuple[list[Any], dict[str, Any]]:
    seen: list[Any] = []
    ids, prev = [], None
    for i in range(5):  # a chain of turns, each storing its own item once ("é": counted as in one process)
        history = rs.conversation("a", prev) if prev else []
        seen.append(_turn(rs, "a", f"resp_a{i}", prev, f"turn {i} é", history))
        ids.append(f"resp_a{i}")
        prev = f"resp_a{i}"
    seen += _observe(rs, "a", ids)
    # another tenant sees none of it, cannot continue or delete it
    seen += [rs.head("b", "resp_a4"), rs.get("b", "resp_a4"), rs.delete("b", "resp_a4"), rs.conversation("b", "resp_a4")]
    # bounds: a row past max_response_bytes, a chain past max_chain_bytes: refused, nothing written
    seen.append(is_big_saved := _turn(rs, "a", "resp_big", None, "x" * 1000, []))
    long_prev, refused_at = "resp_a4", None
    for i in range(20):
        if not _turn(rs, "a", f"resp_l{i}", long_prev, "y" * 300, rs.conversation("a", long_prev)):
            refused_at = i
            break
        long_prev = f"resp_l{i}"
    seen += [refused_at, rs.head("a", long_prev), rs.count("a"), rs.row_sizes("a")]
    # deleting a link a later turn needs hides it; the chain still reads through it
    seen += [rs.delete("a", "resp_a2"), rs.delete("a", "resp_a2"), rs.get("a", "resp_a2"),
             rs.conversation("a", "resp_a4"), rs.row_sizes("a")]
    # count bound: the oldest go (hidden while linked), ...
    for i in range(4):
        seen.append(_turn(rs, "b", f"resp_b{i}", None, f"b {i}", []))
    seen += _observe(rs, "b", [f"resp_b{i}" for i in range(4)]) + _observe(rs, "a", ids)
    # ... and age: an expired response is gone at the next save, its link too once nothing needs it
    _age(rs, "resp_b0", 24 * 365)
    seen.append(_turn(rs, "b", "resp_b4", "resp_b3", "b 4", rs.conversation("b", "resp_b3")))
    seen += _observe(rs, "b", [f"resp_b{i}" for i in range(5)])
    # a turn whose previous response went meanwhile keeps its whole conversation
    history = rs.conversation("b", "resp_b4")
    seen += [rs.delete("b", "resp_b4"), rs.delete("b", "resp_b3")]
    seen.append(_turn(rs, "b", "resp_b5", "resp_b4", "b 5", history))
    seen += _observe(rs, "b", ["resp_b5"])
    seen += [rs.purge_tenant("a"), rs.count("a"), rs.row_sizes("a"), rs.count()]
    facts = {"is_big_saved": is_big_saved, "refused_at": refused_at, "kept_b": sorted(rs.row_sizes("b"))}
    return seen, facts


def test_both_stores_answer_a_scenario_alike(embedded, postgres):
    assert isinstance(embedded, ResponseStore) and isinstance(postgres, ResponseStore)
    (expected, facts), (got, got_facts) = _scenario(embedded), _scenario(postgres)
    assert len(got) == len(expected) and got_facts == facts
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"observation {i} differs"
    # the scenario reached what it meant to: a refused row, a chain refused mid-way, links swept
    # (b0 expired; b3 and b4, deleted, went once b5 kept its whole conversation instead of linking)
    assert facts["is_big_saved"] is False and 2 <= facts["refused_at"] <= 6, facts
    assert facts["kept_b"] == ["resp_b1", "resp_b2", "resp_b5"], facts


def test_replicas_share_one_database(server, postgres):
    url = postgres.engine.url.render_as_string(hide_password=False)
    other = PostgresResponseStore(url, LIMITS)  # a second gateway's store
    try:
        assert _turn(postgres, "a", "resp_1", None, "hello", [])
        history = other.conversation("a", "resp_1")
        assert [i.get("content") for i in history][0] == "hello"
        assert _turn(other, "a", "resp_2", "resp_1", "again", history)
        assert [i.get("content") for i in postgres.conversation("a", "resp_2")][::2] == ["hello", "again"]
        assert other.delete("a", "resp_2") and postgres.response("a", "resp_2") is None
        assert postgres.head("b", "resp_1") is None
    finally:
        other.close()


def test_an_unreachable_database_is_a_503_naming_the_setting():
    from tokenops.errors import APIError
    from tokenops.testing_serve import free_port

    rs = PostgresResponseStore(f"postgresql+psycopg://nobody:secret@127.0.0.1:{free_port()}/none", LIMITS)
    with pytest.raises(APIError) as e:
        rs.head("a", "resp_1")
    assert e.value.status == 503 and e.value.code == "shared_state_unavailable"
    assert "[shared] postgres_url" in e.value.message and "secret" not in e.value.message


def test_shared_settings_name_the_key_when_wrong(tmp_path):
    from tokenops.config import ConfigError, load_settings

    path = tmp_path / "tokenops.toml"
    path.write_text('[shared]\npostgres_url = "mysql://user:secret@db/x"\n')
    with pytest.raises(ConfigError, match=r"\[shared\]: postgres_url: expected a postgresql\+psycopg://") as e:
        load_settings(path, environ={})
    assert "secret" not in str(e.value)
    path.write_text("[shared]\npostgres_uri = 1\n")
    with pytest.raises(ConfigError, match=r"\[shared\]: unknown key\(s\) postgres_uri"):
        load_settings(path, environ={})
    env = {"TOKENOPS_SHARED__POSTGRES_URL": "postgresql://gw@db:5432/tokenops"}
    assert load_settings(None, environ=env).shared.sqlalchemy_url == "postgresql+psycopg://gw@db:5432/tokenops"
    assert load_settings(None, environ={}).shared.postgres_url is None
