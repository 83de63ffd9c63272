"""The built-in DuckDB sink plugin, driven through the plugin manager."""

from __future__ import annotations

import time

from tokenops.plugin_manager import get_plugin_manager, hook, list_plugins
from tokenops.store import sink
from tokenops.types import TelemetryEvent


def test_duckdb_sink_is_a_builtin_telemetry_plugin():
    info = {p.name: p for p in list_plugins()}["duckdb_sink"]
    assert info.layer == "telemetry" and info.source == "builtin"
    assert info.hooks == ["tokenops_record"]


def test_events_reach_the_store_through_the_hook(tokenops_store):
    assert get_plugin_manager().has_plugin("duckdb_sink")
    hook().tokenops_record(event=TelemetryEvent("requests", {"id": "r1", "model_served": "m", "tokens_in": 3}))
    ts = time.time() - 100
    stats = [{"replica": "r0", "num_running": n} for n in range(3)]
    hook().tokenops_record(event=TelemetryEvent("engine_stats", stats, ts=ts))
    hook().tokenops_record(event=TelemetryEvent("some_other_sinks_kind", {"x": 1}))  # ignored, no error
    tokenops_store.writer().flush()
    assert tokenops_store.execute("SELECT id, model_served, tokens_in FROM requests").fetchall() == [("r1", "m", 3)]
    rows = tokenops_store.execute("SELECT num_running, epoch(ts) FROM engine_stats ORDER BY num_running").fetchall()
    assert [r[0] for r in rows] == [0, 1, 2]
    assert all(abs(r[1] - ts) < 1e-3 for r in rows)  # the event's time is the rows' default ts


def test_attach_detach_and_unattached_events(store):
    writer = store.writer()
    sink.detach()
    before = sink.num_unattached
    assert sink.record(TelemetryEvent("requests", {"id": "lost"})) is False
    assert sink.num_unattached == before + 1
    assert sink.attach(writer) is None
    try:
        assert sink.current() is writer
        assert sink.record(TelemetryEvent("requests", {"id": "kept"})) is True
    finally:
        assert sink.detach() is writer
    writer.flush()
    assert store.execute("SELECT id FROM requests").fetchall() == [("kept",)]
