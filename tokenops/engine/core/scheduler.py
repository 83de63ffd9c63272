"""Continuous batching with a per-step token budget (chunked prefill / Dynamic SplitFuse).

Each step fills ``max_num_batched_tokens``: running decodes first (one token each),
then the next chunk of running sequences whose prompt is partly computed, then new
sequences from the waiting queue, in the order of ``config.schedule_policy`` (picked from
the ``schedule_orders`` the engine passes in: fcfs and priority are built in).
When a decode finds no free KV block, the latest-arrived running sequence is
preempted by recompute: its blocks are freed and it goes back to the waiting queue.

Priority classes (``config.priority_classes``, live): a sequence is "interactive" (API
requests) or "batch" (Batch API lines). Waiting interactive sequences are admitted before any
batch one, whatever the queue order says within a class; running interactive prefills get the
budget before batch ones, and a step that computes an interactive prompt carries no batch
prompt (batch decodes still run). When a waiting interactive sequence finds no slot or no KV blocks, the
newest running batch sequences are preempted (by recompute) until it fits, and a decode short
of KV preempts batch sequences before interactive ones. While interactive work is present
(waiting or running), batch sequences are admitted up to ``batch_max_share`` of ``max_num_seqs``
and take at most that share of each step's tokens; while interactive work waits, the batch
sequences above that share are preempted. A preempted batch sequence waits at the head of
the batch class and resumes as soon as room returns. With ``batch_step_overhead`` (live), a
step with interactive work carries batch work worth at most that share of the interactive work's
own time, by the step-time fit the engine feeds (:mod:`.step_cost`): batch decodes past that sit
the step out with their KV kept (in turn, so each advances), then batch prompts fill the rest; what a
step leaves unspent carries over (up to one batch row's cost), so that beside interactive work
smaller than a row's share a batch row still runs every few steps.
The config object is read every step, so live tunable changes apply on the next one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokenops.engine.core.policies import BUILTIN_SCHEDULE_ORDERS, fcfs_order
from tokenops.engine.core.priority_classes import (
    CREDIT_ROWS,
    Allowance,
    BatchCap,
    batch_cap,
    make_room_for_interactive,
    overhead_allowance,
)
from tokenops.engine.core.sequence import Sequence, SequenceStatus
from tokenops.engine.core.step_cost import StepCost
from tokenops.engine.kv.block_manager import BlockManager

if TYPE_CHECKING:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.protocols import ScheduleOrder


@dataclass(slots=True)
class ScheduledChunk:
    """``num_tokens`` tokens of ``seq`` starting at position ``start_pos``."""

    seq: Sequence
    start_pos: int
    num_tokens: int
    row: int = 0  # index of this chunk's (first) logits row in the step's output
    #: Speculative decode: proposed tokens verified after the decode token (their slots
    #: are allocated; ``num_tokens`` counts them). The engine fills ``spec_token_ids``.
    num_spec_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)
    #: Logits rows this chunk gets (set by the engine): 1, ``1 + k`` for a verify chunk, every
    #: position for a prompt whose logprobs were asked (``SamplingParams.prompt_logprobs``).
    num_logits: int = 1

    @property
    def is_last(self) -> bool:
        """The chunk reaches the sequence's last token, so its logits give a new token."""
        return self.start_pos + self.num_tokens - self.num_spec_tokens == len(self.seq.token_ids)


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    #: ``(src, dst)`` KV block copies to make before the forward (copy-on-write).
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class Scheduler:
    """Owns the waiting and running queues and the block manager."""

    def __init__(
        self,
        config: EngineConfig,
        num_blocks: int,
        schedule_orders: Mapping[str, ScheduleOrder] = BUILTIN_SCHEDULE_ORDERS,
    ) -> None:
        self.config = config
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        #: Queue orders by name; ``config.schedule_policy`` picks one each step (a live tunable).
        self.schedule_orders = schedule_orders
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0
        #: Of those, preemptions of batch sequences (most of them to make room for interactive ones).
        self.num_batch_preemptions = 0
        #: Speculative decoding: how many proposed tokens to budget for a decoding
        #: sequence (None = off). Set by the engine.
        self.num_spec_tokens_fn: Callable[[Sequence], int] | None = None
        #: The step-time fit the engine feeds after each step (``batch_step_overhead`` reads it).
        self.step_cost = StepCost()
        self._batch_turn = 0  # round robin over batch decodes when not all fit the allowance
        #: ``batch_step_overhead``'s allowance the last step left unspent (seconds; 0 while nothing
        #: interactive runs), and the most of it carried over, in batch decode rows.
        self.batch_credit = 0.0
        self.credit_rows = CREDIT_ROWS

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_running_batch(self) -> int:
        return sum(1 for s in self.running if s.is_batch)

    @property
    def num_waiting_batch(self) -> int:
        return sum(1 for s in self.waiting if s.is_batch)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        assert seq.status is SequenceStatus.WAITING and not seq.block_table
        assert len(seq.token_ids) <= self.block_manager.num_blocks * self.config.block_size, (
            "the engine must reject prompts that cannot fit the KV cache"
        )
        self.waiting.append(seq)

    # -- one step ----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        config = self.config
        self.block_manager.enable_prefix_caching = config.enable_prefix_caching
        out = SchedulerOutput()
        classes = config.priority_classes
        if classes and self.waiting:

            def preempt(seq: Sequence) -> None:
                self._preempt(seq)
                out.preempted.append(seq)

            interactive = self._order([s for s in self.waiting if not s.is_batch])
            make_room_for_interactive(config, self.block_manager, self.running, interactive, preempt)
        allowance = None
        if classes:
            allowance = overhead_allowance(
                config, self.step_cost, self.running, self.waiting, self.batch_credit, self.credit_rows
            )
        self._build(out, classes, allowance)
        self.batch_credit = 0.0 if allowance is None else _carry(allowance, out.chunks)
        return out

    def _build(self, out: SchedulerOutput, classes: bool, allowance: Allowance | None) -> None:
        """The step's chunks, once interactive sequences have their room: decodes, then prompts."""
        config = self.config
        prefills = [s for s in self.running if s.is_prefill]
        paused = self._paused_batch_decodes(allowance.num_rows) if allowance is not None else set()
        budget, is_short = self._schedule_decodes(out, classes, paused)
        may_admit = not is_short and bool(self.waiting)
        if not classes:
            budget = self._schedule_prefills(prefills, budget, out)
            if may_admit:
                self._admit(self._order(self.waiting), budget, out)
            return
        # interactive work first; batch work takes what is left, within its share
        num_chunks = len(out.chunks)
        budget = self._schedule_prefills([s for s in prefills if not s.is_batch], budget, out)
        if may_admit:
            budget = self._admit(self._order([s for s in self.waiting if not s.is_batch]), budget, out)
        if len(out.chunks) > num_chunks:
            # a step that computes an interactive prompt carries no batch prompt: the prompt's
            # time to first token is its own prefill (and the decodes), not a batch prompt's too
            return
        cap = batch_cap(config, self.running, self.waiting, sum(c.num_tokens for c in out.chunks if c.seq.is_batch))
        if allowance is not None:
            num_rows = sum(1 for c in out.chunks if c.seq.is_batch)
            cap = cap or BatchCap(config.max_num_seqs, config.max_num_batched_tokens)
            cap.num_tokens = min(cap.num_tokens, allowance.num_tokens(num_rows))
        budget = self._schedule_prefills([s for s in prefills if s.is_batch], budget, out, cap)
        if may_admit and not any(not s.is_batch for s in self.waiting):
            self._admit(self._order(self.waiting), budget, out, cap)

    def _order(self, waiting: list[Sequence]) -> list[Sequence]:
        # the engine validates names when built and when the tunable changes: fcfs is only a guard
        return self.schedule_orders.get(self.config.schedule_policy, fcfs_order)(list(waiting))

    def _paused_batch_decodes(self, num_rows: int) -> set[int]:
        """The batch decodes (seq ids) that sit this step out, their KV kept: all but ``num_rows``,
        taken in turn so that each advances."""
        decodes = [s.seq_id for s in self.running if s.is_batch and not s.is_prefill]
        if len(decodes) <= num_rows:
            return set()
        start = self._batch_turn % len(decodes)
        self._batch_turn += num_rows  # a step that runs none (its credit banks) moves no turn
        kept = {decodes[(start + k) % len(decodes)] for k in range(num_rows)}
        return set(decodes) - kept

    def _schedule_decodes(self, out: SchedulerOutput, classes: bool, paused: set[int]) -> tuple[int, bool]:
        """One token per running decode (but the ``paused`` ones); returns the budget left and
        whether KV ran short."""
        bm, budget = self.block_manager, self.config.max_num_batched_tokens
        decodes = [s for s in self.running if not s.is_prefill and s.seq_id not in paused]
        scheduled: set[int] = set()  # seq ids; victims are the latest-arrived of the others
        is_short = False
        for i, seq in enumerate(decodes):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if budget == 0:
                # budget < running decodes: the skipped ones go first next step, so none starves
                skipped = [s for s in decodes[i:] if s.status is SequenceStatus.RUNNING]
                kept = scheduled | paused
                self.running = skipped + [s for s in self.running if s.seq_id in kept or s.is_prefill]
                break
            while not bm.can_append(seq):
                candidates = [s for s in self.running if s is not seq and s.seq_id not in scheduled]
                # under priority classes batch sequences go first, so interactive ones keep their KV
                victim = (
                    max(candidates, key=lambda s: (classes and s.is_batch, s.arrival_time, s.seq_id))
                    if candidates
                    else seq
                )
                self._preempt(victim)
                out.preempted.append(victim)
                is_short = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            out.block_copies += bm.append_slot(seq)
            num_spec = 0
            if self.num_spec_tokens_fn is not None and budget > 1:
                # never take blocks the decodes still to schedule may need
                num_spec = bm.reserve_slots(
                    seq, min(self.num_spec_tokens_fn(seq), budget - 1), num_kept_free=len(decodes) - i - 1
                )
            out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, 1 + num_spec, num_spec_tokens=num_spec))
            scheduled.add(seq.seq_id)
            budget -= 1 + num_spec
        return budget, is_short

    def _schedule_prefills(
        self, prefills: list[Sequence], budget: int, out: SchedulerOutput, cap: BatchCap | None = None
    ) -> int:
        """The next chunk of each running sequence whose prompt is partly computed."""
        for seq in prefills:
            limit = budget if cap is None else min(budget, cap.num_tokens)
            if limit == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            num_tokens = min(seq.num_uncomputed_tokens, limit)
            out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, num_tokens))
            budget -= num_tokens
            if cap is not None:
                cap.num_tokens -= num_tokens
        return budget

    def _admit(self, ordered: list[Sequence], budget: int, out: SchedulerOutput, cap: BatchCap | None = None) -> int:
        """Admit waiting sequences in ``ordered`` until one does not fit; returns the budget left.
        ``cap`` bounds the batch sequences among them."""
        config, bm = self.config, self.block_manager
        num_seqs = len(self.running)
        for seq in ordered:
            limit = budget if cap is None or not seq.is_batch else min(budget, cap.num_tokens)
            if limit == 0:
                break
            # an empty batch admits anything, so n > max_num_seqs cannot starve
            if num_seqs and num_seqs + 1 + seq.num_pending_forks > config.max_num_seqs:
                break
            if cap is not None and seq.is_batch and cap.num_seqs < 1 + seq.num_pending_forks:
                break
            if not bm.can_allocate(seq):
                break
            bm.allocate(seq)
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.time()
            self.running.append(seq)
            num_seqs += 1 + seq.num_pending_forks
            num_tokens = min(seq.num_uncomputed_tokens, limit)
            out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, num_tokens))
            budget -= num_tokens
            if cap is not None and seq.is_batch:
                cap.num_seqs -= 1 + seq.num_pending_forks
                cap.num_tokens -= num_tokens
        return budget

    def _preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and queue it for recomputation at the front. With prefix caching
        its full blocks stay cached while free (and go to the KV offload tier when evicted, if the
        engine has one), so resuming it loads them back instead of recomputing them."""
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        self.waiting.insert(0, seq)
        self.num_preemptions += 1
        if seq.is_batch:
            self.num_batch_preemptions += 1

    def update_computed(self, out: SchedulerOutput) -> None:
        """Record that the step computed its chunks; registers newly full blocks."""
        for chunk in out.chunks:
            seq = chunk.seq
            assert seq.num_computed_tokens == chunk.start_pos
            seq.num_computed_tokens += chunk.num_tokens
            self.block_manager.cache_computed_blocks(seq, chunk.start_pos)

    # -- lifecycle ---------------------------------------------------------------------

    def fork(self, parent: Sequence) -> list[Sequence]:
        """Create ``parent``'s pending siblings (n > 1), sharing its blocks."""
        children = []
        for i in range(parent.num_pending_forks):
            child = parent.fork(parent.output_index + 1 + i)
            self.block_manager.fork(parent, child)
            children.append(child)
        parent.num_pending_forks = 0
        at = self.running.index(parent) + 1
        self.running[at:at] = children
        return children

    def finish(self, seq: Sequence) -> None:
        """Retire a sequence: free its blocks and drop it from the queues."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    def abort(self, request_id: str) -> list[Sequence]:
        """Retire every sequence of ``request_id``; returns them."""
        seqs = [s for s in self.running + self.waiting if s.request_id == request_id]
        for seq in seqs:
            self.finish(seq)
        return seqs


def _carry(allowance: Allowance, chunks: list[ScheduledChunk]) -> float:
    """The credit the step leaves for the next: its allowance less the batch rows and prompt tokens in it."""
    batch = [c for c in chunks if c.seq.is_batch]
    num_rows = sum(1 for c in batch if not c.seq.is_prefill)
    return allowance.carry(num_rows, sum(c.num_tokens for c in batch if c.seq.is_prefill))
