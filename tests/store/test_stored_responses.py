"""Stored ``/v1/responses`` answers (tokenops/store/stored_responses.py): per tenant, bounded by
age and by count per tenant, purged with the tenant."""

from __future__ import annotations

from datetime import timedelta

from tokenops.store.migrations import utcnow
from tokenops.store.stored_responses import Limits, ResponseStore, purge_stored_responses


def _save(rs: ResponseStore, tenant: str, rid: str) -> None:
    rs.save(tenant, {"id": rid, "model": "m", "output": [{"type": "message"}]}, [{"type": "message", "id": "msg_1"}])


def test_a_tenant_reads_and_deletes_only_its_own(store):
    rs = ResponseStore(store)
    _save(rs, "a", "resp_1")
    found = rs.get("a", "resp_1")
    assert found is not None and found.response["output"] == [{"type": "message"}] and found.input_items[0]["id"] == "msg_1"
    assert rs.get("b", "resp_1") is None and not rs.delete("b", "resp_1")
    assert rs.delete("a", "resp_1") and rs.get("a", "resp_1") is None and not rs.delete("a", "resp_1")


def test_each_tenant_keeps_at_most_its_newest(store):
    rs = ResponseStore(store, Limits(max_per_tenant=3))
    for i in range(5):
        _save(rs, "a", f"resp_a{i}")
    _save(rs, "b", "resp_b0")
    assert rs.count("a") == 3 and rs.get("a", "resp_a0") is None and rs.get("a", "resp_a4") is not None
    assert rs.count("b") == 1  # another tenant's traffic does not evict it


def test_old_responses_expire(store):
    rs = ResponseStore(store, Limits(max_age_s=3600))
    _save(rs, "a", "resp_old")
    store.execute("UPDATE stored_responses SET created_at = ? WHERE id = 'resp_old'", [utcnow() - timedelta(hours=2)])
    assert rs.get("a", "resp_old") is None  # expired: not served even before it is deleted
    _save(rs, "a", "resp_new")  # saving evicts what expired
    assert rs.count() == 1 and rs.get("a", "resp_new") is not None


def test_purge_with_the_tenant(store):
    rs = ResponseStore(store)
    for rid in ("resp_1", "resp_2"):
        _save(rs, "gone", rid)
    _save(rs, "stays", "resp_3")
    assert purge_stored_responses(store, "gone") == {"stored_responses": 2}
    assert rs.count("gone") == 0 and rs.count("stays") == 1
    assert purge_stored_responses(None, "gone") == {"stored_responses": 0}


def _turn(rs: ResponseStore, tenant: str, rid: str, own: list, history: list, previous: str | None) -> list:
    body = {"id": rid, "model": "m", "output": [{"type": "message", "id": f"out_{rid}"}]}
    assert rs.save(tenant, body, history + own, previous, len(history))
    return history + own + body["output"]


def test_a_chain_is_stored_as_links_each_turn_once(store):
    rs = ResponseStore(store)
    history = _turn(rs, "a", "r1", [{"id": "i1"}], [], None)
    history = _turn(rs, "a", "r2", [{"id": "i2"}], history, "r1")
    _turn(rs, "a", "r3", [{"id": "i3"}, {"id": "i3b"}], history, "r2")
    rows = dict(store.execute("SELECT id, input_items FROM stored_responses").fetchall())
    assert rows["r3"] == '[{"id":"i3"},{"id":"i3b"}]'  # its own items only, not the turns before
    found = rs.get("a", "r3")
    assert [i["id"] for i in found.input_items] == ["i1", "out_r1", "i2", "out_r2", "i3", "i3b"]
    head = rs.head("a", "r3")
    assert head.num_chain_items == 7 and head.num_chain_bytes == sum(rs.row_sizes("a").values())
    assert rs.head("b", "r3") is None and rs.conversation("b", "r3") == []


def test_deleted_or_evicted_turns_stay_links_until_nothing_needs_them(store):
    rs = ResponseStore(store, Limits(max_per_tenant=2))
    history = _turn(rs, "a", "r1", [{"id": "i1"}], [], None)
    history = _turn(rs, "a", "r2", [{"id": "i2"}], history, "r1")
    assert rs.delete("a", "r1") and rs.get("a", "r1") is None and rs.head("a", "r1") is None
    assert [i["id"] for i in rs.get("a", "r2").input_items] == ["i1", "out_r1", "i2"]
    _turn(rs, "a", "r3", [{"id": "i3"}], history, "r2")  # r1 is now a hidden link of r3's chain too
    _turn(rs, "a", "x1", [{"id": "j1"}], [], None)  # count bound 2: r2 is evicted (hidden), still a link
    assert rs.count("a") == 2 and rs.get("a", "r2") is None
    assert [i["id"] for i in rs.get("a", "r3").input_items] == ["i1", "out_r1", "i2", "out_r2", "i3"]
    rs.delete("a", "r3")  # the last turn that needed them: the links go with it
    assert set(rs.row_sizes("a")) == {"x1"}
    assert rs.purge_tenant("a") == 1 and rs.row_sizes("a") == {}


def test_a_row_or_chain_past_its_bound_is_not_stored(store):
    rs = ResponseStore(store, Limits(max_response_bytes=400, max_chain_bytes=700))
    body = {"id": "big", "output": []}
    assert not rs.save("a", body, [{"text": "x" * 500}]) and rs.get("a", "big") is None
    history = _turn(rs, "a", "r1", [{"text": "x" * 200}], [], None)
    history = _turn(rs, "a", "r2", [{"text": "x" * 200}], history, "r1")
    head = rs.head("a", "r2")
    assert rs.limits.bound_passed(300, head) == "max_chain_bytes" and rs.limits.bound_passed(401, None)
    assert not rs.save("a", {"id": "r3", "output": []}, history + [{"text": "x" * 300}], "r2", len(history))


def test_rows_stored_before_links_still_answer_and_continue(tmp_path):
    """Migration 10: a row of migration 9 holds the whole conversation; a chain walk ends there."""
    import duckdb

    from tokenops.store import Store
    from tokenops.store.migrations import apply_migrations

    path = str(tmp_path / "old.duckdb")
    con = duckdb.connect(path)
    apply_migrations(con, upto=9)
    con.execute(
        "INSERT INTO stored_responses VALUES ('old', 'a', ?, 'm', 'older', ?, ?, 10)",
        [utcnow(), '[{"id":"i0"},{"id":"o0"},{"id":"i1"}]', '{"id":"old","output":[{"id":"o1"}]}'],
    )
    con.close()
    with Store.open(path) as store:
        rs = ResponseStore(store)
        assert [i["id"] for i in rs.get("a", "old").input_items] == ["i0", "o0", "i1"]
        assert rs.head("a", "old").num_chain_items == 4
        history = rs.conversation("a", "old")
        _turn(rs, "a", "new", [{"id": "i2"}], history, "old")
        assert [i["id"] for i in rs.get("a", "new").input_items] == ["i0", "o0", "i1", "o1", "i2"]
