"""Scheduler: token budget, decode-first, chunked prefill, preemption, queue order; property test."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenops.engine.core.config import EngineConfig
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.engine.core.scheduler import Scheduler
from tokenops.engine.core.sequence import Sequence, SequenceStatus


def fcfs(waiting):
    return sorted(waiting, key=lambda s: s.arrival_time)


def make(num_blocks=32, block_size=4, budget=16, max_seqs=8, orders=None, **kw):
    config = EngineConfig(block_size=block_size, kv_cache_tokens=num_blocks * block_size,
                          max_num_batched_tokens=budget, max_num_seqs=max_seqs, **kw)
    return Scheduler(config, num_blocks, orders if orders is not None else {"fcfs": fcfs})


_clock = iter(range(10**9))


def seq(n_tokens, first=0, max_tokens=4, n=1, priority=0, tenant="default", request_id=None):
    t = next(_clock)
    s = Sequence(request_id or f"r{t}", [(first + i) % 50 for i in range(n_tokens)],
                 SamplingParams(max_tokens=max_tokens, n=n), tenant=tenant, priority=priority, arrival_time=t)
    return s


def step(sched, token=7):
    """One engine step without a model: compute the chunks, sample ``token``, retire finished."""
    out = sched.schedule()
    assert out.num_batched_tokens <= sched.config.max_num_batched_tokens
    sched.update_computed(out)
    for chunk in out.chunks:
        if chunk.is_last:
            family = [chunk.seq] + (sched.fork(chunk.seq) if chunk.seq.num_pending_forks else [])
            for s in family:
                s.token_ids.append(token)
                if s.num_output_tokens >= s.params.max_tokens:
                    sched.finish(s)
    return out


def all_tables(sched):
    return [s.block_table for s in sched.running + sched.waiting]


def test_long_prompt_is_split_into_budget_sized_chunks():
    sched = make(budget=8)
    s = seq(20)
    sched.add(s)
    sizes = [[c.num_tokens for c in step(sched).chunks] for _ in range(4)]
    assert sizes == [[8], [8], [4], [1]]
    assert s.num_output_tokens == 2


def test_decodes_go_first_and_prefill_fills_the_rest():
    sched = make(budget=8)
    a = seq(3)
    sched.add(a)
    step(sched)  # a prefilled, now decoding
    b = seq(30)
    sched.add(b)
    out = step(sched)
    assert [(c.seq, c.num_tokens) for c in out.chunks] == [(a, 1), (b, 7)]


def test_partially_prefilled_running_goes_before_waiting():
    sched = make(budget=8)
    a, b = seq(12), seq(12)
    sched.add(a)
    sched.add(b)
    out = step(sched)
    assert [(c.seq, c.num_tokens) for c in out.chunks] == [(a, 8)]
    out = step(sched)
    assert [(c.seq, c.num_tokens) for c in out.chunks] == [(a, 4), (b, 4)]


def test_max_num_seqs_limits_the_running_batch():
    sched = make(max_seqs=2, budget=64)
    for _ in range(4):
        sched.add(seq(3))
    step(sched)
    assert sched.num_running == 2 and sched.num_waiting == 2


def test_n_siblings_count_towards_max_num_seqs():
    sched = make(max_seqs=3, budget=64)
    sched.add(seq(3, n=3))
    sched.add(seq(3))
    step(sched)
    assert sched.num_running == 3 and sched.num_waiting == 1


def test_live_budget_change_applies_next_step():
    sched = make(budget=8)
    sched.add(seq(40))
    assert step(sched).num_batched_tokens == 8
    sched.config.max_num_batched_tokens = 16
    assert step(sched).num_batched_tokens == 16


def test_prefix_hit_skips_cached_tokens():
    sched = make(budget=64)
    a = seq(10)
    sched.add(a)
    step(sched)
    b = seq(11)  # same first 10 tokens (token ids are 0..)
    sched.add(b)
    out = step(sched)
    chunk = next(c for c in out.chunks if c.seq is b)
    assert (chunk.start_pos, chunk.num_tokens) == (8, 3) and b.num_cached_tokens == 8
    sched.config.enable_prefix_caching = False
    c = seq(11)
    sched.add(c)
    chunk = next(ch for ch in step(sched).chunks if ch.seq is c)
    assert (chunk.start_pos, chunk.num_tokens) == (0, 11)


def test_preemption_frees_the_latest_arrival_and_recomputes_it():
    sched = make(num_blocks=4, block_size=2, budget=64, max_seqs=4)
    a, b = seq(3, max_tokens=6), seq(3, first=20, max_tokens=6)
    sched.add(a)
    sched.add(b)
    step(sched)
    step(sched)  # each holds 2 full blocks; the pool is full
    out = step(sched)  # both need a third block
    assert out.preempted == [b] and b.status is SequenceStatus.WAITING and b.block_table == []
    assert sched.waiting[0] is b and sched.num_preemptions == 1
    sched.block_manager.check_invariants(all_tables(sched))
    while sched.has_unfinished():
        step(sched)
    assert a.num_output_tokens == b.num_output_tokens == 6
    assert sched.block_manager.num_free_blocks == 4


def test_a_lone_sequence_preempts_itself_and_no_new_prefill_starts():
    sched = make(num_blocks=2, block_size=2, budget=64, max_seqs=4)
    a = seq(3, max_tokens=5)
    sched.add(a)
    step(sched)
    step(sched)  # a holds both blocks, full
    b = seq(1, first=40)
    sched.add(b)
    out = sched.schedule()
    assert out.preempted == [a] and out.chunks == []  # b would fit now, but not in this step
    assert sched.waiting == [a, b] and sched.block_manager.num_free_blocks == 2


def test_priority_policy_built_in_and_switched_live():
    from tokenops.engine.core.policies import BUILTIN_SCHEDULE_ORDERS

    sched = make(max_seqs=1, budget=64, schedule_policy="priority", orders=BUILTIN_SCHEDULE_ORDERS)
    low, high = seq(3, priority=5, max_tokens=1), seq(3, priority=0, max_tokens=1)
    sched.add(low)
    sched.add(high)
    assert step(sched).chunks[0].seq is high
    assert step(sched).chunks[0].seq is low
    sched.config.schedule_policy = "fcfs"
    late_high, early_low = seq(3, priority=0, max_tokens=1), seq(3, priority=9, max_tokens=1)
    early_low.arrival_time = -1
    sched.add(late_high)
    sched.add(early_low)
    assert step(sched).chunks[0].seq is early_low


def test_abort_frees_blocks_of_running_and_waiting():
    sched = make(budget=64, max_seqs=1)
    a, b = seq(9, request_id="a"), seq(9, request_id="b")
    sched.add(a)
    sched.add(b)
    step(sched)
    assert [s.request_id for s in sched.abort("a")] == ["a"]
    assert sched.abort("b") == [b] and not sched.has_unfinished()
    assert sched.block_manager.num_free_blocks == 32


# -- property test -----------------------------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 14), st.integers(1, 5), st.integers(1, 2), st.integers(0, 3),
                  st.sampled_from(["t0", "t1"])),
        st.tuples(st.just("step"), st.integers(0, 4)),
        st.tuples(st.just("finish"), st.integers(0, 99)),
        st.tuples(st.just("abort"), st.integers(0, 99)),
        st.tuples(st.just("budget"), st.integers(1, 24)),
        st.tuples(st.just("caching"), st.booleans()),
    ),
    max_size=50,
)


@settings(max_examples=120, deadline=None)
@given(ops=_ops, policy=st.sampled_from(["fcfs", "priority"]))
def test_random_workloads_never_leak_blocks(ops, policy):
    from tokenops.engine.core.policies import BUILTIN_SCHEDULE_ORDERS

    sched = make(num_blocks=10, block_size=2, budget=8, max_seqs=4, schedule_policy=policy,
                 orders=BUILTIN_SCHEDULE_ORDERS)
    seqs: list[Sequence] = []
    for op in ops:
        kind = op[0]
        if kind == "add":
            _, length, max_tokens, n, priority, tenant = op
            s = seq(length, first=length % 3, max_tokens=max_tokens, n=n, priority=priority, tenant=tenant)
            sched.add(s)
            seqs.append(s)
        elif kind == "step":
            step(sched, token=op[1])
        elif kind == "finish" and sched.running:
            sched.finish(sched.running[op[1] % len(sched.running)])
        elif kind == "abort" and seqs:
            sched.abort(seqs[op[1] % len(seqs)].request_id)
        elif kind == "budget":
            sched.config.max_num_batched_tokens = op[1]
        elif kind == "caching":
            sched.config.enable_prefix_caching = op[1]
        sched.block_manager.check_invariants(all_tables(sched))
        assert all(not s.block_table for s in sched.waiting)
        assert all(s.num_computed_tokens < len(s.token_ids) or not s.is_prefill for s in sched.running)
    sched.config.max_num_batched_tokens = 8
    for _ in range(500):
        if not sched.has_unfinished():
            break
        step(sched)
        sched.block_manager.check_invariants(all_tables(sched))
    assert not sched.has_unfinished(), "the queue must drain"
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks
    for s in seqs:
        assert s.status is SequenceStatus.FINISHED and s.block_table == []


def test_decodes_beyond_the_budget_take_turns():
    sched = make(budget=64, max_seqs=8)
    seqs = [seq(2, first=10 * i, max_tokens=50) for i in range(4)]
    for s in seqs:
        sched.add(s)
    step(sched)  # all prefilled
    sched.config.max_num_batched_tokens = 2
    served = [c.seq for _ in range(2) for c in step(sched).chunks]
    assert sorted(s.seq_id for s in served) == sorted(s.seq_id for s in seqs)
