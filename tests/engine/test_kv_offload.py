"""KV offload tier: the index's books, the block manager's use of it, and greedy output
unchanged through the real engine (tiny random Llama, CPU) after the pool evicted a prefix."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenops.engine.kv.block_manager import BlockManager
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.kv.offload_index import OffloadIndex
from tokenops.engine.kv.offload_store import OffloadStore
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.engine.core.sequence import Sequence


def seq(tokens, tenant="default"):
    return Sequence("r", list(tokens), SamplingParams(), tenant=tenant)


def run_once(bm, s):
    """Allocate, pretend the runner computed every token, free; returns the transfers."""
    bm.allocate(s)
    before = s.num_computed_tokens
    s.num_computed_tokens = len(s.token_ids)
    bm.cache_computed_blocks(s, before)
    bm.free(s)
    return bm.take_transfers()


def test_evicted_prefix_is_saved_then_loaded_back_instead_of_recomputed():
    bm = BlockManager(4, 4, offload=OffloadIndex(8))
    a = list(range(13))  # 3 full blocks + 1 token
    assert run_once(bm, seq(a)) == []
    ops = run_once(bm, seq(range(100, 116)))  # needs all 4 blocks: A's 3 cached blocks are evicted
    assert sorted(op[0] for op in ops) == ["save"] * 3
    back = seq(a)
    bm.allocate(back)
    assert back.num_cached_tokens == 12 and back.num_computed_tokens == 12
    loads = bm.take_transfers()
    assert [op[0] for op in loads].count("load") == 3
    assert [op[2] for op in loads if op[0] == "load"] == back.block_table[:3]
    assert bm.num_offload_hits == 12 and bm.offload.num_loaded_blocks == 3
    bm.check_invariants([back.block_table])
    # exclusive tiers: loaded blocks left the tier and are registered in the pool again
    assert bm.offload.num_host_blocks == 4  # the other sequence's 4 full blocks, evicted by this one
    table = list(back.block_table)
    bm.free(back)
    assert bm.can_allocate(seq(a)) and bm._lookup(seq(a)) == table[:3]


def test_tier_is_salted_per_tenant():
    bm = BlockManager(4, 4, offload=OffloadIndex(8))
    run_once(bm, seq(range(13), tenant="t1"))
    run_once(bm, seq(range(100, 116)))
    other = seq(range(13), tenant="t2")
    bm.allocate(other)
    assert other.num_cached_tokens == 0
    assert not [op for op in bm.take_transfers() if op[0] != "save"]  # saves of B's blocks only


def test_saves_during_an_allocation_cannot_push_out_its_own_tier_hits():
    # host tier of 2 slots holding the returning prefix; loading it evicts 2 other cached
    # blocks from the pool, whose saves need those very slots
    bm = BlockManager(4, 4, offload=OffloadIndex(2))
    run_once(bm, seq(range(9)))  # 2 cached blocks (+ 1 partial)
    run_once(bm, seq(range(100, 116)))  # evicts them: saved; its own 4 blocks stay cached
    back = seq(range(9))
    bm.allocate(back)
    ops = bm.take_transfers()
    loads = [op for op in ops if op[0] == "load"]
    assert len(loads) == 2 and back.num_cached_tokens == 8
    # every load comes before a save that reuses its slot
    for i, op in enumerate(ops):
        if op[0] == "load":
            assert all(not (o[0] == "save" and o[2] == op[1]) for o in ops[:i])
    bm.check_invariants([back.block_table])


def test_host_overflow_spills_to_disk_and_falls_out_of_the_last_tier():
    index = OffloadIndex(1, num_disk_blocks=1)
    ops = []
    index.save(1, "t", (1,), 10, ops)
    index.save(2, "t", (2,), 11, ops)  # host full: 1 spills to disk
    index.save(3, "t", (3,), 12, ops)  # 2 spills, 1 drops off the disk
    assert ops == [("save", 10, 0), ("spill", 0, 1), ("save", 11, 0), ("drop_disk", 1), ("spill", 0, 2),
                   ("save", 12, 0)]
    assert not index.contains(1, "t", (1,))
    assert index.contains(2, "t", (2,)) and index.contains(3, "t", (3,))
    assert not index.contains(2, "other", (2,)) and not index.contains(2, "t", (9,))
    ops.clear()
    index.load(2, index.claim(2), 5, ops)
    assert ops == [("load_disk", 2, 5), ("drop_disk", 2)]
    assert index.stats()["disk_loaded_blocks"] == 1 and index.num_dropped_blocks == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 14)), min_size=1, max_size=30),
       st.integers(1, 4), st.integers(0, 3))
def test_random_workloads_keep_the_books_consistent(plan, num_slots, num_disk):
    """A shadow KV store: executing the ops in order always loads the block content that
    was saved under that prefix."""
    bm = BlockManager(6, 2, offload=OffloadIndex(num_slots, num_disk))
    pool = {}  # block id -> tokens the "forward" wrote
    host, disk = {}, {}
    for prefix, length in plan:
        s = seq([prefix] * length if prefix % 2 else [prefix, *range(length - 1)])
        if not bm.can_allocate(s):
            continue
        bm.allocate(s)
        for op in bm.take_transfers():
            if op[0] == "save":
                host[op[2]] = pool[op[1]]
            elif op[0] == "load":
                pool[op[2]] = host[op[1]]
            elif op[0] == "spill":
                disk[op[2]] = host[op[1]]
            elif op[0] == "load_disk":
                pool[op[2]] = disk[op[1]]
            else:
                disk.pop(op[1])
        for i in range(s.num_computed_tokens // 2):  # loaded and pool hits hold the right tokens
            assert pool[s.block_table[i]] == tuple(s.token_ids[2 * i:2 * i + 2])
        for i in range(s.num_computed_tokens // 2, len(s.block_table)):
            pool[s.block_table[i]] = tuple(s.token_ids[2 * i:2 * i + 2])
        before = s.num_computed_tokens
        s.num_computed_tokens = len(s.token_ids)
        bm.cache_computed_blocks(s, before)
        bm.free(s)
        bm.check_invariants([])
        assert bm.offload.num_host_blocks <= num_slots and bm.offload.num_disk_blocks_used <= num_disk


def test_store_round_trips_blocks_through_host_and_disk(tmp_path):
    cache = torch.randn(2, 3, 4, 2, 1, 5)
    store = OffloadStore(cache, None, 1, 1, str(tmp_path))
    want0, want1 = cache[:, :, 0].clone(), cache[:, :, 1].clone()
    store.execute([("save", 0, 0), ("spill", 0, 7), ("save", 1, 0)])
    cache.zero_()
    store.execute([("load", 0, 2), ("load_disk", 7, 3), ("drop_disk", 7)])
    assert torch.equal(cache[:, :, 2], want1) and torch.equal(cache[:, :, 3], want0)
    assert not list(tmp_path.glob("kv-*.pt"))


def test_config_rejects_bad_offload_options():
    with pytest.raises(ValueError, match="kv_offload_host_mb"):
        EngineConfig(kv_offload_host_mb=-1)
    with pytest.raises(ValueError, match="host tier"):
        EngineConfig(kv_offload_disk_blocks=4)
    with pytest.raises(ValueError, match="draft proposer"):
        EngineConfig(kv_offload_host_blocks=4, speculative="draft", draft_model="x")


def _returning_session(model_dir, **kw):
    """A, then B (evicts A from the 16-block pool), then A again plus a new turn; greedy."""
    engine = LLMEngine(EngineConfig(model=str(model_dir), device="cpu", block_size=4, kv_cache_tokens=64,
                                    max_num_batched_tokens=32, **kw))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    a = [(7 * i) % 50 + 3 for i in range(41)]
    b = [(11 * i) % 60 + 2 for i in range(45)]
    outs = [engine.generate([p], params)[0] for p in (a, b, a + [9, 9, 8], a)]
    return [o.outputs[0].token_ids for o in outs], outs, engine


@pytest.mark.parametrize("options", [{}, {"kv_cache_dtype": "int8"}, {"disk": True}])
def test_greedy_output_identical_with_and_without_the_tier(tiny_llama_dir, tmp_path, options):
    extra = {k: v for k, v in options.items() if k != "disk"}
    tier = {"kv_offload_host_blocks": 2, "kv_offload_disk_blocks": 64, "kv_offload_disk_path": str(tmp_path)} \
        if options.get("disk") else {"kv_offload_host_blocks": 64}
    base, base_outs, _ = _returning_session(tiny_llama_dir, **extra)
    got, outs, engine = _returning_session(tiny_llama_dir, **tier, **extra)
    assert got == base
    stats = engine.stats()["kv_offload"]
    assert stats["loaded_blocks"] >= 5 and stats["hit_tokens"] == 4 * stats["loaded_blocks"]
    if options.get("disk"):
        assert stats["disk_loaded_blocks"] > 0
    # without the tier the returning prompt was recomputed; with it, it came from the tier
    assert base_outs[2].num_cached_tokens < 40 <= outs[2].num_cached_tokens
    engine.scheduler.block_manager.check_invariants([])


def test_plugin_settings_reach_the_engine_config():
    from tokenops_plugins.model_optimization.kv_offload import KvOffload
    plugin = KvOffload()

    from tokenops.config import Settings as RealSettings

    def Settings(conf):  # the real settings with only [plugins.kv_offload]
        return RealSettings(plugins={"kv_offload": conf})

    saved = dict(plugin.conf)
    try:
        plugin.tokenops_configure(Settings({}))
        config = EngineConfig()
        plugin.tokenops_engine_config(config)
        assert config.kv_offload_host_mb == 0  # off by default
        plugin.tokenops_configure(Settings({"enabled": True, "host_mb": 64, "disk_mb": 128, "disk_path": "/tmp/x"}))
        plugin.tokenops_engine_config(config)
        assert (config.kv_offload_host_mb, config.kv_offload_disk_mb, config.kv_offload_disk_path) == (64, 128, "/tmp/x")
        config.__post_init__()
        with pytest.raises(ValueError, match="unknown key"):
            plugin.tokenops_configure(Settings({"enabled": True, "size": 3}))
        with pytest.raises(ValueError, match="host_mb"):
            plugin.tokenops_configure(Settings({"enabled": True, "host_mb": -2}))
    finally:
        plugin.conf.clear()
        plugin.conf.update(saved)
