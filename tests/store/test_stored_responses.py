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
