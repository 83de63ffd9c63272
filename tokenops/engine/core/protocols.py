"""What the bundled engine calls on the policies it is given (public contracts).

:class:`tokenops.engine.core.engine.LLMEngine` takes its policies as constructor arguments
(:class:`tokenops.engine.core.policies.EnginePolicies`): the waiting-queue order, the
speculative proposers, the KV policy, the weight transforms and the compile step. The
defaults are the built-ins; ``tokenops serve`` collects plugin-provided ones from the
hooks once, when it builds the engine (:mod:`tokenops.policy_hooks`). Everything
the engine calls on a policy is declared here, and nothing else is called.

Threads: the engine calls these methods on its own thread (the step loop), one call at a
time; time spent in them delays every sequence in the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.sequence import Sequence


@dataclass(slots=True)
class Proposal:
    """Proposed tokens for one sequence.

    ``probs`` (``[len(token_ids), vocab]``) are the distributions the tokens were drawn
    from, for rejection sampling of non-greedy requests; None for a deterministic proposer
    (n-gram lookup, a draft model's argmax): the target then accepts a proposed token
    with its own probability of it."""

    token_ids: list[int] = field(default_factory=list)
    probs: Any = None


@runtime_checkable
class Proposer(Protocol):
    """A speculative-decoding proposer (selected by ``EngineConfig.speculative``).

    Per step the engine calls :meth:`propose` for the decoding sequences that budgeted
    proposals, verifies them in the target's forward, then calls :meth:`on_verified` per
    sequence. :meth:`release` and :meth:`retain` let a stateful proposer (a draft model
    with its own cache positions) forget sequences.
    """

    #: Vocabulary size of the proposals' token ids, checked against the target's at build
    #: time (a draft model must share the target's tokenizer); None when the proposer only
    #: copies tokens from the sequence itself.
    vocab_size: int | None

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Proposal]:
        """One :class:`Proposal` per sequence, of at most ``num_tokens[i]`` tokens to follow
        ``seqs[i].token_ids`` (fewer, or none, is fine: the unused slots are freed).
        Slots for positions ``len(seq) .. len(seq) + num_tokens[i] - 1`` are allocated in
        ``seq.block_table``; a proposer with its own KV cache of the same geometry may write
        them."""
        ...

    def on_verified(self, seq: Sequence, num_proposed: int, num_accepted: int) -> None:
        """After verification, before the accepted tokens are appended to ``seq``: the first
        ``num_accepted`` of ``num_proposed`` proposals were kept."""
        ...

    def release(self, seq: Sequence) -> None:
        """``seq`` finished while its proposals were verified: drop any state kept for it.
        Sequences that end otherwise (aborted, or finished by a step without proposals) are
        not released one by one; :meth:`retain` drops them."""
        ...

    def retain(self, seq_ids: set[int]) -> None:
        """Keep state only for these running ``Sequence.seq_id`` s (called every 64 steps)."""
        ...


#: ``factory(config) -> Proposer``: builds the proposer of one engine, once, from its final
#: :class:`EngineConfig` (``num_speculative_tokens``, ``draft_model``, ``seed`` ...).
ProposerFactory = Callable[["EngineConfig"], Proposer]


@runtime_checkable
class KVPolicy(Protocol):
    """KV-cache eviction for decoding sequences (the built-in is sink + window).

    After every step the engine asks, for each running sequence that is decoding, which of
    its blocks to release; it frees them and marks their table entries -1 (the attention
    mask hides those positions). Positions are never moved."""

    def blocks_to_evict(self, num_tokens: int, block_size: int, block_table: list[int]) -> list[int]:
        """Indexes into ``block_table`` (not block ids) of live blocks (entry >= 0) to free,
        for a sequence of ``num_tokens`` tokens whose next query sees positions
        ``< num_tokens``. Must never include the last block (it receives the next token)."""
        ...


@runtime_checkable
class ScheduleOrder(Protocol):
    """A waiting-queue order (selected by ``EngineConfig.schedule_policy``)."""

    def __call__(self, waiting: list[Sequence]) -> list[Sequence]:
        """The waiting sequences in the order to admit them (a new list; same elements).

        Called in every scheduler step that has waiting sequences and budget left: keep it
        fast. ``Sequence.arrival_time``, ``priority``, ``tenant``, ``token_ids`` and
        ``params`` are what an order usually reads."""
        ...


#: ``transform(model, config) -> replacement or None`` (quantization, pruning), applied in
#: order after loading and before the weights are packed and the model compiled.
ModelTransform = Callable[["torch.nn.Module", "EngineConfig"], "torch.nn.Module | None"]

#: ``compile(model) -> compiled module or None`` (None keeps the model as it is).
ModelCompiler = Callable[["torch.nn.Module"], "torch.nn.Module | None"]
