"""Block manager: allocation, prefix caching, tenant salt, LRU eviction, forks; property tests."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenops.engine.kv.block_manager import BlockManager
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.engine.core.sequence import Sequence


def seq(tokens, tenant="default"):
    return Sequence("r", list(tokens), SamplingParams(), tenant=tenant)


def computed(bm, s):
    """Pretend the runner computed every token of ``s`` (registers its full blocks)."""
    before = s.num_computed_tokens
    s.num_computed_tokens = len(s.token_ids)
    bm.cache_computed_blocks(s, before)


def test_allocate_and_free_returns_every_block():
    bm = BlockManager(8, 4)
    a = seq(range(10))
    assert bm.can_allocate(a)
    bm.allocate(a)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 5
    assert a.num_computed_tokens == 0
    bm.free(a)
    assert bm.num_free_blocks == 8 and a.block_table == []
    bm.check_invariants([])


def test_can_allocate_refuses_when_pool_too_small():
    bm = BlockManager(2, 4)
    assert not bm.can_allocate(seq(range(9)))
    assert bm.can_allocate(seq(range(8)))


def test_prefix_hit_reuses_full_computed_blocks_only():
    bm = BlockManager(16, 4)
    a = seq(range(10))
    bm.allocate(a)
    b = seq(range(10))
    bm.allocate(b)  # a is not computed yet: nothing to share
    assert b.num_cached_tokens == 0
    computed(bm, a)
    c = seq(list(range(10)) + [99])
    bm.allocate(c)
    assert c.block_table[:2] == a.block_table[:2]  # two full blocks hit, the partial third does not
    assert c.num_computed_tokens == c.num_cached_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert bm.num_prefix_queries == 10 + 10 + 11 and bm.num_prefix_hits == 8
    bm.check_invariants([a.block_table, b.block_table, c.block_table])


def test_last_token_is_never_a_hit():
    bm = BlockManager(16, 4)
    a = seq(range(8))
    bm.allocate(a)
    computed(bm, a)
    b = seq(range(8))  # same 8 tokens: the second block holds the last token, must be recomputed
    bm.allocate(b)
    assert b.num_computed_tokens == 4
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_tenants_never_share_blocks():
    bm = BlockManager(16, 4)
    a = seq(range(12), tenant="alice")
    bm.allocate(a)
    computed(bm, a)
    b = seq(range(12), tenant="bob")
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not set(a.block_table) & set(b.block_table)
    c = seq(range(12), tenant="alice")
    bm.allocate(c)
    assert c.num_cached_tokens == 8


def test_chained_hash_needs_identical_prefix():
    bm = BlockManager(16, 4)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(a)
    computed(bm, a)
    b = seq([0, 2, 3, 4, 5, 6, 7, 8, 9])  # same second block, different first
    bm.allocate(b)
    assert b.num_cached_tokens == 0


def test_freed_cached_blocks_are_reused_then_evicted_lru():
    bm = BlockManager(4, 2)
    a = seq([1, 2, 3, 4, 5])  # 3 blocks, two full
    bm.allocate(a)
    computed(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    b = seq([1, 2, 3, 4, 7])
    bm.allocate(b)  # revives both cached blocks from the free list
    assert b.num_cached_tokens == 4 and bm.num_evictions == 0
    bm.free(b)
    # four fresh blocks needed: the never-cached block goes first, then the cached ones, LRU first
    c = seq([9, 9, 9, 9, 9, 9, 9])
    assert bm.can_allocate(c)
    bm.allocate(c)
    assert bm.num_evictions == 2 and bm.num_cached_blocks == 0
    bm.check_invariants([c.block_table])


def test_lru_evicts_least_recently_freed_first():
    bm = BlockManager(4, 2)
    a, b = seq([1, 2, 0]), seq([3, 4, 0])
    for s in (a, b):
        bm.allocate(s)
        computed(bm, s)
    bm.free(a)
    bm.free(b)  # a's cached block is older on the LRU list
    c = seq([5, 6, 7, 8, 0])  # three fresh blocks: the two never-cached ones, then one eviction
    bm.allocate(c)
    assert bm.num_evictions == 1
    bm.free(c)
    again_b = seq([3, 4, 0])
    bm.allocate(again_b)
    assert again_b.num_cached_tokens == 2  # b's block survived
    again_a = seq([1, 2, 0])
    bm.allocate(again_a)
    assert again_a.num_cached_tokens == 0  # a's block was the one evicted
    bm.check_invariants([again_a.block_table, again_b.block_table])


def test_append_slot_adds_a_block_at_the_boundary():
    bm = BlockManager(4, 2)
    a = seq([1, 2])
    bm.allocate(a)
    a.num_computed_tokens = 2
    a.token_ids.append(3)
    assert bm.can_append(a)
    assert bm.append_slot(a) == [] and len(a.block_table) == 2
    a.token_ids.append(4)
    assert bm.append_slot(a) == [] and len(a.block_table) == 2


def test_fork_shares_blocks_and_copies_the_partial_block_on_write():
    bm = BlockManager(8, 4)
    parent = seq(range(6))
    bm.allocate(parent)
    computed(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert all(bm.blocks[b].ref_count == 2 for b in parent.block_table)
    for s in (parent, child):
        s.token_ids.append(50 + s.output_index)
    copies = bm.append_slot(parent)
    assert len(copies) == 1 and copies[0][0] == child.block_table[1] and parent.block_table[1] == copies[0][1]
    assert bm.append_slot(child) == []  # now the sole owner of the original partial block
    assert parent.block_table[0] == child.block_table[0]
    bm.check_invariants([parent.block_table, child.block_table])
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 8
    bm.check_invariants([])


def test_can_append_false_when_pool_is_full():
    bm = BlockManager(2, 2)
    a = seq([1, 2, 3, 4])
    bm.allocate(a)
    a.num_computed_tokens = 4
    a.token_ids.append(5)
    assert not bm.can_append(a)


def test_disabled_prefix_caching_neither_hits_nor_registers():
    bm = BlockManager(8, 2, enable_prefix_caching=False)
    a = seq([1, 2, 3, 4, 5])
    bm.allocate(a)
    computed(bm, a)
    assert bm.num_cached_blocks == 0
    bm.allocate(b := seq([1, 2, 3, 4, 5]))
    assert b.num_cached_tokens == 0 and bm.num_prefix_queries == 0


def test_reset_prefix_cache_forgets_free_cached_blocks():
    bm = BlockManager(8, 2)
    a = seq([1, 2, 3, 4, 5])
    bm.allocate(a)
    computed(bm, a)
    bm.free(a)
    assert bm.reset_prefix_cache() == 2
    bm.check_invariants([])
    assert bm.num_cached_blocks == 0


# -- property test -----------------------------------------------------------------------

_ops = st.lists(
    st.tuples(st.sampled_from(["add", "compute", "decode", "fork", "free"]),
              st.integers(0, 7), st.integers(1, 11), st.sampled_from(["t0", "t1"])),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, enable=st.booleans())
def test_random_operations_keep_accounting_exact(ops, enable):
    bm = BlockManager(10, 3, enable_prefix_caching=enable)
    live: list[Sequence] = []
    for op, pick, length, tenant in ops:
        if op == "add":
            s = seq([(pick + i) % 3 for i in range(length)], tenant)  # few distinct tokens: many hits
            if bm.can_allocate(s):
                bm.allocate(s)
                assert s.num_computed_tokens < len(s.token_ids)
                live.append(s)
        elif live:
            s = live[pick % len(live)]
            if op == "compute":
                computed(bm, s)
            elif op == "decode" and s.num_computed_tokens == len(s.token_ids):
                s.token_ids.append(pick % 3)
                if bm.can_append(s):
                    bm.append_slot(s)
                    computed(bm, s)
                else:
                    s.token_ids.pop()
            elif op == "fork" and bm.num_free_blocks > 0:
                child = s.fork(1)
                bm.fork(s, child)
                live.append(child)
            elif op == "free":
                bm.free(s)
                live.remove(s)
        bm.check_invariants([s.block_table for s in live])
        # a block that two sequences hold must hold the same tokens for both (or be copied first)
        for s in live:
            for i, block_id in enumerate(s.block_table):
                block = bm.blocks[block_id]
                if block.block_hash is not None:
                    assert block.token_ids == tuple(s.token_ids[i * 3:(i + 1) * 3])
                    assert block.salt == s.tenant
    for s in live:
        bm.free(s)
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks
