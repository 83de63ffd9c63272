"""Named queries on seeded data, with exact expected values."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from tokenops.store import QUERIES, parse_since
from tokenops.store.queries import QueryError, UnknownQueryError, describe, run_query

from store_helpers import DAY1, DAY2, epoch


def _as_dicts(result):
    return [dict(zip(result["columns"], row)) for row in result["rows"]]


@pytest.fixture
def seeded(store):
    w = store.writer()
    t1, t2 = epoch(DAY1), epoch(DAY2)
    rows = []
    # day 1, model a: four ok requests, one error, one rejected
    for i, ttft in enumerate([0.1, 0.2, 0.3, 0.4]):
        rows.append({
            "id": f"a{i}", "ts": t1 + i * 60, "model_requested": "auto", "model_served": "a", "status": "ok",
            "ttft_s": ttft, "tpot_s": ttft / 10, "e2e_s": ttft * 10, "tokens_in": 100, "tokens_out": 10 * (i + 1),
            "tokens_cached": 16 * i, "cost_usd": 0.001, "cache_hit": i == 0, "router": "cost", "route_reason": "cheap",
        })
    rows.append({"id": "a-err", "ts": t1 + 600, "model_served": "a", "model_requested": "auto", "status": "error",
                 "ttft_s": None, "e2e_s": 9.0, "tokens_in": 100, "tokens_out": 0, "cost_usd": 0.0005,
                 "router": "cost", "route_reason": "cheap", "escalated": True})
    rows.append({"id": "a-rej", "ts": t1 + 700, "model_requested": "a", "status": "rejected", "http_status": 429,
                 "router": "name", "route_reason": "by-name"})
    # day 2, model b (hour 15) : two ok requests
    rows += [
        {"id": "b0", "ts": t2, "model_requested": "b", "model_served": "b", "status": "ok", "ttft_s": 1.0,
         "tpot_s": 0.05, "e2e_s": 3.0, "tokens_in": 50, "tokens_out": 5, "cost_usd": 0.01, "cache_hit": True,
         "router": "name", "route_reason": "by-name"},
        {"id": "b1", "ts": t2 + 1, "model_requested": "b", "model_served": "b", "status": "ok", "ttft_s": 2.0,
         "tpot_s": 0.15, "e2e_s": 5.0, "tokens_in": 50, "tokens_out": 15, "cost_usd": 0.01, "cache_hit": False,
         "router": "name", "route_reason": "by-name"},
    ]
    w.write_many("requests", rows)
    # replica r0 serving a: counters 100/10 -> 300/110 -> restart -> 50/40
    stats = [(0, 100, 10), (1, 300, 110), (2, 50, 40)]
    w.write_many("engine_stats", [
        {"ts": t1 + s, "replica": "r0", "model": "a", "prefix_cache_queries": q, "prefix_cache_hits": h} for s, q, h in stats
    ])
    # expert load: an old interval outside the window and two recent ones
    loads = [(-120, 0, 0, 1000), (-1, 0, 0, 10), (0, 0, 0, 30), (0, 0, 1, 60), (0, 1, 0, 5)]
    w.write_many("expert_load", [
        {"ts": t2 + dt, "model": "moe", "replica": "r0", "layer": layer, "expert": e, "tokens": n} for dt, layer, e, n in loads
    ])
    w.flush()
    return store


def test_usage_by_model_day(seeded):
    rows = _as_dicts(seeded.run_query("usage_by_model_day", since="2026-11-01"))
    assert [(r["day"], r["model"]) for r in rows] == [("2026-11-01", "a"), ("2026-11-02", "b")]
    a, b = rows
    assert (a["requests"], a["errors"], a["rejected"]) == (6, 1, 1)  # the rejected one was asked for "a"
    assert (a["tokens_in"], a["tokens_out"], a["tokens_cached"]) == (500, 100, 96)
    assert a["cost_usd"] == pytest.approx(0.0045)
    # quantile_cont over the ok requests only: 0.1 0.2 0.3 0.4
    assert a["ttft_p50"] == pytest.approx(0.25) and a["ttft_p95"] == pytest.approx(0.385)
    assert a["e2e_p50"] == pytest.approx(2.5) and a["e2e_p95"] == pytest.approx(3.85)
    assert (b["requests"], b["tokens_in"], b["tokens_out"], b["cost_usd"]) == (2, 100, 20, pytest.approx(0.02))
    assert b["ttft_p50"] == pytest.approx(1.5) and b["ttft_p95"] == pytest.approx(1.95)


def test_usage_respects_since(seeded):
    rows = seeded.run_query("usage_by_model_day", since=DAY2 - timedelta(hours=1))["rows"]
    assert [r[1] for r in rows] == ["b"]


def test_latency_by_model_hour(seeded):
    rows = _as_dicts(seeded.run_query("latency_by_model_hour", since="all"))
    assert [(r["hour"], r["model"], r["requests"]) for r in rows] == [
        ("2026-11-01T10:00:00", "a", 4),
        ("2026-11-02T15:00:00", "b", 2),
    ]
    b = rows[1]
    assert b["tpot_p50"] == pytest.approx(0.1) and b["tpot_p95"] == pytest.approx(0.145)
    assert b["e2e_p50"] == pytest.approx(4.0) and b["e2e_p95"] == pytest.approx(4.9)


def test_cache_hit_rates(seeded):
    rows = seeded.run_query("cache_hit_rates", since="all")["rows"]
    assert rows == [
        ["gateway", "a", 6, 1, pytest.approx(1 / 6)],
        ["gateway", "b", 2, 1, 0.5],
        # increases: 200 lookups/100 hits, then a restart counts its 50/40 from zero
        ["prefix", "a", 250, 140, pytest.approx(140 / 250)],
    ]


def test_recent_requests_newest_first_with_limit(seeded):
    rows = _as_dicts(seeded.run_query("recent_requests", limit="3"))
    assert [r["id"] for r in rows] == ["b1", "b0", "a-rej"]
    assert rows[0]["ts"] == (DAY2 + timedelta(seconds=1)).isoformat()


def test_route_reasons(seeded):
    rows = seeded.run_query("route_reasons", since="all")["rows"]
    assert rows == [
        ["auto", "a", "cost", "cheap", 5, pytest.approx(0.625), 1, None],
        ["b", "b", "name", "by-name", 2, pytest.approx(0.25), 0, None],
        ["a", None, "name", "by-name", 1, pytest.approx(0.125), 0, None],
    ]


def test_expert_load_latest_sums_the_window(seeded):
    rows = seeded.run_query("expert_load_latest", window_s=60)["rows"]
    assert rows == [
        ["moe", 0, 0, 40, pytest.approx(0.4)],
        ["moe", 0, 1, 60, pytest.approx(0.6)],
        ["moe", 1, 0, 5, pytest.approx(1.0)],
    ]
    assert seeded.run_query("expert_load_latest", model="other")["rows"] == []


def test_config_changes_query(store):
    store.record_config_change("a", 1, 2, actor="x", source="admin-api")
    store.record_config_change("b", "fcfs", "priority")
    rows = store.run_query("config_changes", limit=10)["rows"]
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [(2, "b", '"fcfs"', '"priority"'), (1, "a", "1", "2")]


def test_every_query_runs_on_an_empty_store(store):
    for name in QUERIES:
        result = store.run_query(name)
        assert result["rows"] == [] and result["columns"], name


def test_unknown_query_lists_the_names(store):
    with pytest.raises(UnknownQueryError) as info:
        run_query(store, "nope")
    assert "unknown query 'nope'" in str(info.value)
    for name in ("usage_by_model_day", "cache_hit_rates", "expert_load_latest"):
        assert name in str(info.value)


def test_bad_parameters_are_clear(store):
    with pytest.raises(QueryError, match="takes no parameter.*bogus.*allowed: since"):
        store.run_query("usage_by_model_day", bogus=1)
    with pytest.raises(QueryError, match="limit='many' is not a valid int"):
        store.run_query("recent_requests", limit="many")
    with pytest.raises(QueryError, match="cannot read since='yesterday'"):
        store.run_query("usage_by_model_day", since="yesterday")


def test_parse_since():
    now = datetime(2026, 11, 21, 12, 0, 0)
    assert parse_since("7d", now) == datetime(2026, 11, 14, 12, 0, 0)
    assert parse_since("24h", now) == datetime(2026, 11, 20, 12, 0, 0)
    assert parse_since("30m", now) == datetime(2026, 11, 21, 11, 30, 0)
    assert parse_since("2026-11-01", now) == datetime(2026, 11, 1)
    assert parse_since("2026-11-01T05:00:00+02:00", now) == datetime(2026, 11, 1, 3, 0, 0)
    assert parse_since("all", now) == datetime(1970, 1, 1)


def test_describe_lists_params():
    info = {q["name"]: q for q in describe()}
    assert info["recent_requests"]["params"] == [{"name": "limit", "type": "int", "default": 50, "help": "maximum number of rows"}]
    assert set(info) == set(QUERIES)
