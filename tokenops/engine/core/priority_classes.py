"""The scheduler's priority classes: what batch sequences may take, and which to preempt for
interactive ones (``config.priority_classes``; the rules are in :mod:`tokenops.engine.core.scheduler`).

Plain functions over the scheduler's queues, so they are read and tested apart from the step loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.sequence import Sequence
    from tokenops.engine.core.step_cost import StepCost
    from tokenops.engine.kv.block_manager import BlockManager


@dataclass(slots=True)
class BatchCap:
    """What batch sequences may still take in this step: slots and tokens."""

    num_seqs: int
    num_tokens: int


def batch_cap(
    config: EngineConfig, running: list[Sequence], waiting: list[Sequence], num_batch_tokens: int
) -> BatchCap | None:
    """What batch sequences may still take this step (``num_batch_tokens`` of it they have taken
    already): while interactive work is present, ``batch_max_share`` of the slots and of the step's
    tokens; always, at most ``batch_step_tokens`` tokens (when set). None: no bound."""
    step_tokens = config.batch_step_tokens or config.max_num_batched_tokens
    if all(s.is_batch for s in running) and all(s.is_batch for s in waiting):
        if step_tokens >= config.max_num_batched_tokens:
            return None
        return BatchCap(config.max_num_seqs, max(0, step_tokens - num_batch_tokens))
    share = config.batch_max_share
    num_batch_seqs = sum(1 + s.num_pending_forks for s in running if s.is_batch)
    return BatchCap(
        max(0, int(share * config.max_num_seqs) - num_batch_seqs),
        max(0, min(int(share * config.max_num_batched_tokens), step_tokens) - num_batch_tokens),
    )


def make_room_for_interactive(
    config: EngineConfig,
    bm: BlockManager,
    running: list[Sequence],
    waiting: list[Sequence],
    preempt: Callable[[Sequence], None],
) -> None:
    """Preempt the newest running batch sequences while batch work holds more than its share of
    the slots, and while the waiting interactive sequences (``waiting``, in queue order) find no
    slot or KV blocks; stops at the first interactive one that would not fit even with every batch
    one gone. ``preempt`` takes a sequence out of ``running`` and frees its blocks."""
    batch = sorted((s for s in running if s.is_batch), key=lambda s: (s.arrival_time, s.seq_id))
    if not batch or not waiting:
        return
    max_batch_seqs = int(config.batch_max_share * config.max_num_seqs)
    while batch and sum(1 + s.num_pending_forks for s in batch) > max_batch_seqs:
        preempt(batch.pop())
    num_seqs = num_blocks = 0  # what the interactive sequences admitted so far need
    for seq in waiting:
        num_seqs += 1 + seq.num_pending_forks
        # every block counted fresh: a cached prefix only makes the room found larger
        num_blocks += bm.num_blocks_for(len(seq.token_ids))
        num_held = len(running) - len(batch)  # the interactive sequences running
        num_batch_blocks = sum(len(s.block_table) for s in batch)
        if (num_held and num_held + num_seqs > config.max_num_seqs) or (
            num_blocks > bm.num_free_blocks + num_batch_blocks
        ):
            return  # it waits for interactive work to finish: preempting batch work would not help
        while batch and (len(running) + num_seqs > config.max_num_seqs or num_blocks > bm.num_free_blocks):
            preempt(batch.pop())


#: The most unspent allowance a step carries to the next, in batch decode rows: with one row's worth
#: banked, a step whose own share is smaller than a row still runs one; more would let the batch
#: burst several rows into one interactive step.
CREDIT_ROWS = 1.0


@dataclass(slots=True)
class Allowance:
    """The batch work a step may carry beside its interactive work (``batch_step_overhead``):
    ``seconds`` of it (this step's share plus the credit carried from the steps before), a decode
    row costing ``row_s`` and a prompt token ``token_s``; at most ``cap_s`` of what is left unspent
    carries over to the next step."""

    seconds: float
    row_s: float
    token_s: float
    cap_s: float = 0.0

    @property
    def num_rows(self) -> int:
        return int(self.seconds / self.row_s)

    def num_tokens(self, num_rows: int) -> int:
        """Batch prompt tokens left once ``num_rows`` batch decode rows are in the step."""
        return max(0, int((self.seconds - num_rows * self.row_s) / self.token_s))

    def carry(self, num_rows: int, num_tokens: int) -> float:
        """The credit for the next step once this one carries ``num_rows`` batch decode rows and
        ``num_tokens`` batch prompt tokens: what they leave unspent, at most ``cap_s``."""
        return min(self.cap_s, max(0.0, self.seconds - num_rows * self.row_s - num_tokens * self.token_s))


def overhead_allowance(
    config: EngineConfig,
    cost: StepCost,
    running: list[Sequence],
    waiting: list[Sequence],
    credit: float = 0.0,
    credit_rows: float = CREDIT_ROWS,
) -> Allowance | None:
    """``batch_step_overhead`` of the time the step's interactive work takes by itself (``cost``: the
    engine's measured decode steps for a decode-only step, else its step-time fit), plus ``credit``
    (the allowance earlier steps left unspent), spent on batch decode rows first, then batch prompt
    tokens; up to ``credit_rows`` batch rows' worth of what is left carries over. So where one step's
    share is less than a row (one interactive decode on a CPU), a row runs every few steps and the
    added time stays at the share over the run. None: off,
    or nothing interactive to protect. The interactive part is estimated before the step is built:
    its decodes, and the prompt tokens of its running and waiting prompts up to the step's token
    budget."""
    if not config.batch_step_overhead:
        return None
    num_rows = sum(1 for s in running if not s.is_batch and not s.is_prefill)
    num_tokens = sum(s.num_uncomputed_tokens for s in running if not s.is_batch and s.is_prefill)
    num_tokens += sum(s.num_uncomputed_tokens for s in waiting if not s.is_batch)
    if not num_rows and not num_tokens:
        return None
    num_tokens = min(num_tokens, max(0, config.max_num_batched_tokens - num_rows))
    _, _, token_s = cost.coefficients()
    alone = cost.decode_s(num_rows) if not num_tokens else None  # measured, where that shape was seen enough
    alone = alone if alone is not None else cost.estimate(num_rows, num_tokens)
    row_s = cost.row_s_beside(num_rows)
    probe = cost.probe(num_rows) if not num_tokens else None
    if probe is not None:  # a step that measures a missing price: exactly that many batch rows, no prompt,
        return Allowance(probe * row_s, row_s, token_s)  # nothing banked (about 20 such steps per width)
    seconds = config.batch_step_overhead * alone + max(0.0, credit)
    return Allowance(seconds, row_s, token_s, credit_rows * row_s)
