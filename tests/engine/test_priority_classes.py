"""Priority classes in the scheduler alone (plain Python, no model): interactive before batch, batch
preempted to make room, the batch share bound, batch on idle capacity, and resumption after preemption."""

import itertools

import pytest

from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine_stats import apply_engine_tunables
from tokenops.engine.core.policies import BUILTIN_SCHEDULE_ORDERS
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.engine.core.scheduler import Scheduler
from tokenops.engine.core.sequence import BATCH, INTERACTIVE, Sequence, SequenceStatus

_clock = itertools.count()


def make(num_blocks=64, block_size=4, budget=64, max_seqs=4, **kw):
    config = EngineConfig(
        block_size=block_size,
        kv_cache_tokens=num_blocks * block_size,
        max_num_batched_tokens=budget,
        max_num_seqs=max_seqs,
        **kw,
    )
    return Scheduler(config, num_blocks, BUILTIN_SCHEDULE_ORDERS)


def seq(n_tokens, cls=INTERACTIVE, max_tokens=4, first=0, priority=0):
    t = next(_clock)
    return Sequence(
        f"{cls[0]}{t}",
        [(first + i) % 50 for i in range(n_tokens)],
        SamplingParams(max_tokens=max_tokens),
        priority=priority,
        arrival_time=t,
        priority_class=cls,
    )


def step(sched, token=7):
    """One engine step without a model: compute the chunks, sample ``token``, retire finished."""
    out = sched.schedule()
    assert out.num_batched_tokens <= sched.config.max_num_batched_tokens
    sched.update_computed(out)
    for chunk in out.chunks:
        if chunk.is_last:
            chunk.seq.token_ids.append(token)
            if chunk.seq.num_output_tokens >= chunk.seq.params.max_tokens:
                sched.finish(chunk.seq)
    return out


def run_until_done(sched, max_steps=500):
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return
        step(sched)
    raise AssertionError(f"not done after {max_steps} steps: {sched.running + sched.waiting}")


def test_waiting_interactive_goes_before_earlier_batch_whatever_the_queue_order():
    for policy in ("fcfs", "priority"):
        sched = make(max_seqs=2, schedule_policy=policy)
        batch = [seq(8, BATCH, priority=-100) for _ in range(3)]  # earlier and "more urgent" by priority
        late = seq(8, INTERACTIVE, priority=100)
        for s in [*batch, late]:
            sched.add(s)
        assert [c.seq for c in step(sched).chunks] == [late], policy
        # the next step, with no interactive prompt in it, takes batch prompts: within the class the
        # queue order still holds
        assert [c.seq for c in step(sched).chunks] == [late, batch[0]], policy


def test_without_priority_classes_the_queue_is_one_first_come_queue():
    sched = make(max_seqs=2, priority_classes=False)
    batch = [seq(8, BATCH) for _ in range(3)]
    late = seq(8, INTERACTIVE)
    for s in [*batch, late]:
        sched.add(s)
    step(sched)
    assert [s.seq_id for s in sched.running] == [batch[0].seq_id, batch[1].seq_id]
    assert sched.num_preemptions == 0


def test_an_interactive_sequence_without_a_slot_preempts_the_newest_batch_one_and_frees_its_blocks():
    sched = make(max_seqs=3)
    batch = [seq(8, BATCH, max_tokens=50, first=10 * i) for i in range(3)]
    for s in batch:
        sched.add(s)
    for _ in range(3):
        step(sched)
    assert sched.num_running == 3 and all(s.block_table for s in batch)
    free_before = sched.block_manager.num_free_blocks
    newest_blocks = len(batch[2].block_table)

    late = seq(8, INTERACTIVE, first=40)  # no prefix shared with the batch prompts
    sched.add(late)
    out = step(sched)
    assert out.preempted == [batch[2]]
    assert batch[2].status is SequenceStatus.WAITING and batch[2].block_table == []
    assert batch[2].num_computed_tokens == 0
    assert late.status is SequenceStatus.RUNNING and late in sched.running
    # the newest batch sequence's blocks went to the interactive one (2 blocks of 4 tokens for 8 + decode)
    assert sched.block_manager.num_free_blocks == free_before + newest_blocks - len(late.block_table)
    assert sched.num_batch_preemptions == 1 and sched.num_preemptions == 1
    assert sched.num_running_batch == 2 and sched.num_waiting_batch == 1


def test_an_interactive_sequence_short_of_kv_preempts_batch_ones_until_it_fits():
    # 16 blocks of 4 tokens: three batch sequences of 16 tokens hold 12 (15 once they decode)
    sched = make(num_blocks=16, max_seqs=8)
    batch = [seq(16, BATCH, max_tokens=40, first=10 * i) for i in range(3)]
    for s in batch:
        sched.add(s)
    for _ in range(2):
        step(sched)
    late = seq(24, INTERACTIVE, first=33)  # 6 blocks
    sched.add(late)
    out = step(sched)
    assert late.status is SequenceStatus.RUNNING
    assert out.preempted and all(s.is_batch for s in out.preempted)
    # newest first: batch[2] before batch[1]; the oldest keeps running
    assert out.preempted[0] is batch[2]
    assert batch[0].status is SequenceStatus.RUNNING


def test_a_decode_short_of_kv_preempts_a_batch_sequence_before_a_newer_interactive_one():
    sched = make(num_blocks=8, max_seqs=8)
    old_batch = seq(12, BATCH, max_tokens=30)
    new_interactive = seq(12, INTERACTIVE, max_tokens=30, first=20)
    for s in (old_batch, new_interactive):
        sched.add(s)
    preempted = []
    for _ in range(12):
        preempted += step(sched).preempted
        if preempted:
            break
    assert preempted and preempted[0] is old_batch  # by arrival alone it would be the interactive one
    assert new_interactive.status is SequenceStatus.RUNNING


def test_batch_holds_at_most_its_share_of_slots_and_tokens_while_interactive_work_is_present():
    sched = make(max_seqs=4, budget=16, batch_max_share=0.5)
    batch = [seq(4, BATCH, max_tokens=60, first=i) for i in range(4)]
    for s in batch:
        sched.add(s)
    step(sched)
    assert sched.num_running_batch == 4  # nothing interactive: batch takes every idle slot

    sched.add(seq(40, INTERACTIVE, max_tokens=20))
    for _ in range(10):
        out = step(sched)
        if any(not s.is_batch for s in sched.running + sched.waiting):
            assert sched.num_running_batch <= 2
            assert sum(c.num_tokens for c in out.chunks if c.seq.is_batch) <= 8
    assert sched.num_batch_preemptions == 2


def test_batch_prefill_tokens_are_bounded_by_the_share_while_interactive_runs():
    sched = make(max_seqs=4, budget=16, batch_max_share=0.25)
    sched.add(seq(8, INTERACTIVE, max_tokens=40))
    step(sched)
    long_batch = seq(40, BATCH, max_tokens=4)
    sched.add(long_batch)
    sizes = [sum(c.num_tokens for c in step(sched).chunks if c.seq.is_batch) for _ in range(3)]
    assert sizes == [4, 4, 4]  # 0.25 of 16 tokens a step


def test_share_zero_runs_batch_only_when_nothing_interactive_is_present():
    sched = make(max_seqs=4, batch_max_share=0.0)
    interactive = seq(8, INTERACTIVE, max_tokens=5)
    batch = seq(8, BATCH, max_tokens=3)
    sched.add(interactive)
    sched.add(batch)
    order = []
    while sched.has_unfinished():
        step(sched)
        for s in (interactive, batch):
            if s.is_finished and s not in order:
                order.append(s)
        assert not (batch.status is SequenceStatus.RUNNING and interactive.status is SequenceStatus.RUNNING)
    assert order == [interactive, batch] and batch.num_output_tokens == 3


def test_a_preempted_batch_sequence_resumes_when_room_returns_and_loads_its_cached_prefix():
    sched = make(max_seqs=2)
    batch = [seq(16, BATCH, max_tokens=12, first=10 * i) for i in range(2)]
    for s in batch:
        sched.add(s)
    for _ in range(3):
        step(sched)
    interactive = [seq(8, INTERACTIVE, max_tokens=3, first=30 + i) for i in range(2)]
    for s in interactive:
        sched.add(s)
    step(sched)
    assert sched.num_batch_preemptions == 2 and all(s.status is SequenceStatus.WAITING for s in batch)
    resumed_at = {}
    for _ in range(500):
        if not sched.has_unfinished():
            break
        for chunk in step(sched).chunks:
            resumed_at.setdefault(chunk.seq.request_id, chunk.start_pos)
    assert all(s.num_output_tokens == 3 for s in interactive)
    assert all(s.num_output_tokens == 12 for s in batch)  # resumed, not starved
    # its 4 full blocks were still cached: the recompute starts after them
    assert [resumed_at[s.request_id] for s in batch] == [16, 16]
    assert sched.num_batch_preemptions == 2  # no preemption loop once the interactive work was done


def test_mixed_traffic_never_loops_and_everything_finishes():
    sched = make(num_blocks=24, max_seqs=3, budget=12, batch_max_share=0.67)
    seqs = []
    for i in range(30):
        s = seq(6 + i % 9, BATCH if i % 3 else INTERACTIVE, max_tokens=3 + i % 5, first=i)
        seqs.append(s)
        sched.add(s)
        step(sched)
    run_until_done(sched)
    assert all(s.is_finished and s.num_output_tokens == s.params.max_tokens for s in seqs)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_the_share_and_the_switch_are_live_tunables_checked_on_the_config():
    from tokenops.plugin_manager import get_tunables

    registry = get_tunables()
    assert registry["engine.batch_max_share"].live and registry["engine.priority_classes"].live
    assert registry["engine.batch_max_share"].default == 1.0

    class Engine:  # what apply_engine_tunables reads
        config = EngineConfig()

    assert apply_engine_tunables(Engine, {"engine.batch_max_share": 0.25}) == {"engine.batch_max_share": 0.25}
    assert Engine.config.batch_max_share == 0.25
    with pytest.raises(ValueError, match="batch_max_share"):
        apply_engine_tunables(Engine, {"batch_max_share": 1.5})
    with pytest.raises(ValueError, match="batch_max_share"):
        EngineConfig(batch_max_share=-0.1)
    with pytest.raises(ValueError, match="priority_classes"):
        EngineConfig(priority_classes="yes")


def test_a_step_with_an_interactive_prompt_carries_batch_decodes_but_no_batch_prompt():
    sched = make(max_seqs=8, budget=64)
    decoding = seq(4, BATCH, max_tokens=40)
    sched.add(decoding)
    step(sched)  # its prompt is computed: it decodes from now on
    sched.add(seq(8, BATCH, first=20))
    interactive = seq(8, INTERACTIVE, first=40)
    sched.add(interactive)
    out = step(sched)
    assert [(c.seq.priority_class, c.num_tokens) for c in out.chunks] == [(BATCH, 1), (INTERACTIVE, 8)]
    # the next step has no interactive prompt: the waiting batch prompt goes in
    assert sum(1 for c in step(sched).chunks if c.seq.is_batch and c.num_tokens > 1) == 1


def test_batch_step_tokens_bounds_every_batch_step_also_with_nothing_interactive():
    # a batch alone fills each step with prompts (up to the budget) unless batch_step_tokens bounds it:
    # the step an interactive request arrives during is then short
    sched = make(max_seqs=4, budget=64, batch_step_tokens=12)
    for i in range(4):
        sched.add(seq(40, BATCH, max_tokens=6, first=10 * i))
    sizes = []
    while sched.has_unfinished():
        out = step(sched)
        batch_tokens = sum(c.num_tokens for c in out.chunks if c.seq.is_batch)
        num_decodes = sum(1 for c in out.chunks if not c.seq.is_prefill or c.num_tokens == 1)
        sizes.append(batch_tokens)
        assert batch_tokens <= max(12, num_decodes)  # decodes always run; prompts fill up to the bound
    assert max(sizes) == 12 and len(sizes) > 4 * 40 // 12

    unbounded = make(max_seqs=4, budget=64)
    for i in range(4):
        unbounded.add(seq(40, BATCH, max_tokens=6, first=10 * i))
    assert sum(c.num_tokens for c in step(unbounded).chunks) == 64


def test_batch_step_tokens_and_the_share_together_take_the_smaller_bound():
    sched = make(max_seqs=4, budget=64, batch_max_share=0.5, batch_step_tokens=8)
    sched.add(seq(8, INTERACTIVE, max_tokens=40))
    step(sched)
    sched.add(seq(40, BATCH, max_tokens=4))
    sizes = [sum(c.num_tokens for c in step(sched).chunks if c.seq.is_batch) for _ in range(3)]
    assert sizes == [8, 8, 8]  # not 0.5 of 64


def test_batch_step_tokens_is_a_live_tunable():
    from tokenops.plugin_manager import get_tunables

    tunable = get_tunables()["engine.batch_step_tokens"]
    assert tunable.live and tunable.default == 0

    class Engine:
        config = EngineConfig()

    assert apply_engine_tunables(Engine, {"batch_step_tokens": 128}) == {"engine.batch_step_tokens": 128}
    assert Engine.config.batch_step_tokens == 128
    with pytest.raises(ValueError, match="batch_step_tokens"):
        EngineConfig(batch_step_tokens=-1)
