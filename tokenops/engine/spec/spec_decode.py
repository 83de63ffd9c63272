"""Speculative decoding inside continuous batching.

Every step, each decoding sequence may carry ``k`` proposed tokens:

1. The scheduler budgets ``1 + k`` tokens for it and allocates slots for them
   (:meth:`SpecDecoder.num_tokens_for` picks ``k``, adaptive per sequence).
2. :meth:`SpecDecoder.propose` asks the proposer (a
   :class:`tokenops.engine.core.protocols.Proposer` named by ``config.speculative``: n-gram
   prompt lookup, a draft model, or one a plugin registers) for up to ``k`` tokens per
   sequence; a shorter proposal shrinks the chunk and frees the unused slots.
3. The target computes the decode token and the ``k`` proposals in ONE forward (a
   chunk of ``1 + k`` tokens with logits at every position).
4. :meth:`SpecDecoder.verify` keeps the accepted prefix plus one target token
   (:mod:`tokenops.engine.spec.rejection`), appends them through the output processor
   (stop rules apply per token), rolls ``num_computed_tokens`` back to the kept
   positions and frees the blocks past them.

Adaptive k: an exponentially weighted moving average of the number of accepted
tokens per round; the next round proposes ``ceil(ewma) + 1`` tokens, within
``[1, num_speculative_tokens]``, so a sequence whose proposals keep failing drops to
one and one that keeps accepting grows to the maximum.

Metrics follow vLLM's names (``num_drafts``, ``num_draft_tokens``,
``num_accepted_tokens``, ``accepted_per_position``) in ``stats()["spec_decode"]``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenops.engine.core.protocols import Proposal, Proposer
from tokenops.engine.core.sequence import SequenceStatus
from tokenops.engine.sampling.logits_processors import needs_processing
from tokenops.engine.sampling.sampling import SampledToken
from tokenops.engine.spec.rejection import verify_greedy, verify_proposal

if TYPE_CHECKING:
    import torch

    from tokenops.engine.core.scheduler import ScheduledChunk
    from tokenops.engine.core.sequence import Sequence

#: Weight of the newest round in the per-sequence acceptance average.
EWMA_ALPHA = 0.5


__all__ = ["Proposal", "Proposer", "SpecDecodeStats", "SpecDecoder"]


@dataclass(slots=True)
class SpecDecodeStats:
    """Cumulative counters, named as vLLM's ``spec_decode`` metrics."""

    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    propose_time_s: float = 0.0

    def __post_init__(self) -> None:
        self.accepted_per_position = [0] * self.num_speculative_tokens

    def record(self, num_proposed: int, num_accepted: int, num_emitted: int) -> None:
        assert 0 <= num_accepted <= num_proposed <= self.num_speculative_tokens
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        self.num_emitted_tokens += num_emitted
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    def as_dict(self) -> dict[str, Any]:
        rate = self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_rate": rate,
            "mean_acceptance_length": (1 + self.num_accepted_tokens / self.num_drafts) if self.num_drafts else 0.0,
            "propose_time_s": self.propose_time_s,
        }


class SpecDecoder:
    """Proposes before the target forward and verifies after it (see module doc)."""

    def __init__(self, engine: Any, proposer: Proposer) -> None:
        """``engine`` is the :class:`~tokenops.engine.core.engine.LLMEngine`; this reads its
        ``config``, ``max_model_len``, ``runner.vocab_size``, ``scheduler`` (``running``,
        ``block_manager``), ``sampler.probs`` and appends through ``append_tokens``."""
        if not isinstance(proposer, Proposer):
            missing = [
                m for m in ("vocab_size", "propose", "on_verified", "release", "retain") if not hasattr(proposer, m)
            ]
            raise TypeError(
                f"speculative proposer {engine.config.speculative!r} ({type(proposer).__name__}) lacks "
                f"{', '.join(missing)}; see tokenops.engine.core.protocols.Proposer"
            )
        target_vocab = getattr(engine.runner, "vocab_size", None)
        if proposer.vocab_size is not None and target_vocab is not None and proposer.vocab_size != target_vocab:
            raise ValueError(
                f"the proposer's vocabulary ({proposer.vocab_size}) differs from the target's "
                f"({target_vocab}); a draft model must share the target's tokenizer"
            )
        self.engine = engine
        self.proposer = proposer
        self.max_k = engine.config.num_speculative_tokens
        self.disable_at = engine.config.speculative_disable_by_batch_size
        self.stats = SpecDecodeStats(self.max_k)
        self._ewma: dict[int, float] = {}  # seq_id -> accepted tokens per round
        self._probs: dict[int, Any] = {}  # seq_id -> proposal distributions of this step
        self._num_rounds = 0

    # -- before scheduling ------------------------------------------------------------

    def num_tokens_for(self, seq: Sequence) -> int:
        """Adaptive k for ``seq``, capped so a fully accepted round neither passes
        ``max_tokens`` nor the context."""
        if seq.grammar is not None:  # a constrained row is sampled under its mask, one token a step
            return 0
        if needs_processing(seq.params):  # penalties, bias, min_tokens change each position's logits: the sampler's
            return 0
        if self.disable_at and self.engine.scheduler.num_running >= self.disable_at:
            return 0  # a large batch: plain decoding is cheaper than verifying k + 1 tokens per row
        if seq.thinking is not None and (seq.thinking.is_thinking or seq.thinking.forced):
            return 0  # budget forcing and reflection masks act in the sampler, one token a step
        ewma = self._ewma.get(seq.seq_id)
        k = self.max_k if ewma is None else min(self.max_k, max(1, math.ceil(ewma - 1e-9) + 1))
        k = min(k, seq.params.max_tokens - seq.num_output_tokens - 1)
        k = min(k, self.engine.max_model_len - len(seq.token_ids) - 1)
        return max(0, k)

    # -- before the forward ------------------------------------------------------------

    def propose(self, chunks: list[ScheduledChunk]) -> None:
        """Fill ``spec_token_ids`` of the chunks that reserved slots; shrink the rest."""
        spec = [c for c in chunks if c.num_spec_tokens]
        self._num_rounds += 1
        if self._num_rounds % 64 == 0:  # forget sequences that finished without a verify
            live = {s.seq_id for s in self.engine.scheduler.running}
            self._ewma = {i: v for i, v in self._ewma.items() if i in live}
            self.proposer.retain(live)
        if not spec:
            return
        start = time.perf_counter()
        proposals = self.proposer.propose([c.seq for c in spec], [c.num_spec_tokens for c in spec])
        self.stats.propose_time_s += time.perf_counter() - start
        bm = self.engine.scheduler.block_manager
        self._probs = {}
        for chunk, proposal in zip(spec, proposals):
            tokens = list(proposal.token_ids)[: chunk.num_spec_tokens]
            chunk.spec_token_ids = tokens
            chunk.num_tokens = 1 + len(tokens)
            chunk.num_spec_tokens = len(tokens)
            if proposal.probs is not None and tokens:
                self._probs[chunk.seq.seq_id] = proposal.probs[: len(tokens)]
            bm.trim(chunk.seq, len(chunk.seq.token_ids) + len(tokens))

    # -- after the forward -------------------------------------------------------------

    def verify(self, logits: torch.Tensor, chunks: list[ScheduledChunk], touched: dict) -> None:
        """Accept/reject the proposals of ``chunks`` (each has ``num_spec_tokens > 0``),
        append the kept tokens and roll back the rest."""
        engine = self.engine
        bm = engine.scheduler.block_manager
        for chunk in chunks:
            seq = chunk.seq
            k = chunk.num_spec_tokens
            rows = logits[chunk.row : chunk.row + k + 1]
            proposed = chunk.spec_token_ids
            params = seq.params
            if params.is_greedy:
                tokens = verify_greedy(rows, proposed)
            else:
                probs = engine.sampler.probs(rows.float(), [params] * (k + 1))
                generator = seq.generator if seq.generator is not None else engine.sampler.generator
                tokens = verify_proposal(probs, proposed, self._probs.pop(seq.seq_id, None), generator)
            num_accepted = len(tokens) - 1
            self.proposer.on_verified(seq, k, num_accepted)
            old = self._ewma.get(seq.seq_id, float(self.max_k))
            self._ewma[seq.seq_id] = (1 - EWMA_ALPHA) * old + EWMA_ALPHA * num_accepted
            sampled = self._sampled_tokens(rows, tokens, params)
            num_emitted = engine.append_tokens(seq, sampled, touched)
            self.stats.record(k, num_accepted, num_emitted)
            if seq.status is not SequenceStatus.RUNNING:
                self.release(seq)
                continue
            # keep the K/V of the decode token and the accepted proposals; the last
            # appended token is computed by the next step
            assert len(seq.token_ids) == chunk.start_pos + 2 + num_accepted
            seq.num_computed_tokens = chunk.start_pos + 1 + num_accepted
            bm.cache_computed_blocks(seq, chunk.start_pos)
            bm.trim(seq)
        self._probs = {}

    def _sampled_tokens(self, rows: torch.Tensor, tokens: list[int], params: Any) -> list[SampledToken]:
        out = [SampledToken(t) for t in tokens]
        if params.logprobs is None:
            return out
        logprobs = rows[: len(tokens)].float().log_softmax(dim=-1)
        k = params.logprobs
        for i, s in enumerate(out):
            s.logprob = float(logprobs[i, s.token_id])
            if k:
                vals, ids = logprobs[i].topk(k)
                s.top = list(zip(ids.tolist(), vals.tolist()))
            else:
                s.top = []
        return out

    def release(self, seq: Sequence) -> None:
        self._ewma.pop(seq.seq_id, None)
        self.proposer.release(seq)
