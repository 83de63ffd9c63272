"""Engine telemetry: engine_stats rows per replica and expert_load as per-interval deltas."""

from __future__ import annotations

from tokenops import hookimpl
from tokenops.backends.base import Replica
from tokenops.gateway.observability.telemetry import EngineTelemetry
from tokenops.testing_gateway import FakeBackend


class _Sink:
    def __init__(self) -> None:
        self.events = []

    @hookimpl
    def tokenops_record(self, event):
        self.events.append(event)


def test_engine_stats_rows_and_expert_load_deltas(register_plugin):
    sink = _Sink()
    register_plugin(sink, "test-sink")
    moe, dense = FakeBackend("moe", expert_load=True), FakeBackend("dense")
    telemetry = EngineTelemetry({"moe": [Replica("moe#0", "moe", moe)], "dense": [Replica("dense#0", "dense", dense)]})
    moe._expert_load[0][1] = 5
    moe._expert_load[1][3] = 2
    telemetry.sample(now=100.0)
    moe._expert_load[0][1] = 8  # +3 since the last sample
    telemetry.sample(now=101.0)
    stats = [e for e in sink.events if e.kind == "engine_stats"]
    loads = [e for e in sink.events if e.kind == "expert_load"]
    assert len(stats) == 2 and {r["replica"] for r in stats[0].data} == {"moe#0", "dense#0"}
    row = next(r for r in stats[0].data if r["replica"] == "moe#0")
    assert row["model"] == "moe" and row["kv_blocks_total"] == 64 and row["ts"] == 100.0
    assert [(r["layer"], r["expert"], r["tokens"]) for r in loads[0].data] == [(0, 1, 5), (1, 3, 2)]
    assert [(r["layer"], r["expert"], r["tokens"]) for r in loads[1].data] == [(0, 1, 3)]
    assert all(r["replica"] == "moe#0" for e in loads for r in e.data)


def test_expert_load_rows_reach_the_store(tokenops_store):
    moe = FakeBackend("moe", expert_load=True)
    moe._expert_load[1][2] = 7
    EngineTelemetry({"moe": [Replica("moe#0", "moe", moe)]}).sample()
    tokenops_store.writer().flush()
    assert tokenops_store.execute("select layer, expert, tokens from expert_load").fetchall() == [(1, 2, 7)]
    assert tokenops_store.execute("select replica, model from engine_stats").fetchall() == [("moe#0", "moe")]
