"""Speculative decoding with a draft model (a second, smaller model, same tokenizer).

The draft model runs in its own :class:`~tokenops.engine.model_runner.ModelRunner`
with its own paged KV cache of the SAME geometry as the target's (block size and
number of blocks), so a sequence's target block table addresses the draft cache
too: the draft writes position ``p`` into the same slot as the target does, and no
second block manager is needed.

Per sequence the proposer remembers how many positions the draft cache holds
(``num_computed``) and the block ids they live in. Each round it first catches up
(one chunk over the tokens the draft has not seen: the prompt on the first round,
the previous round's corrected/bonus token afterwards), then runs ``k - 1`` more
single-token steps, batched over all sequences. After verification only the
positions of accepted tokens stay valid, so ``num_computed`` is cut back and the
rejected positions are recomputed next round. If the sequence's blocks changed
(preempted and recomputed), the draft starts over from position 0.

Greedy requests get the draft's argmax; sampled requests draw from the draft's
distribution (with the request's temperature/top-k/top-p and its seeded generator)
and hand those distributions to the rejection sampler.

Enable with ``EngineConfig(speculative="draft", draft_model="path/to/draft")`` or
``[plugins.speculative] method = "draft"`` plus ``draft_model`` (see
``ngram_proposer.py`` for the shared settings).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tokenops import hookimpl

TOKENOPS_LAYER = "model_optimization"


@dataclass(slots=True)
class _DraftState:
    num_computed: int = 0
    blocks: tuple[int, ...] = ()  # block ids holding positions [0, num_computed)


class DraftModelProposer:
    """Proposals from a draft model sharing the target's block tables."""

    def __init__(self, config: Any, runner: Any = None, min_confidence: float = 0.0) -> None:
        from tokenops.engine.model_runner import ModelRunner
        from tokenops.engine.sampling import Sampler

        if runner is None:
            if not config.draft_model:
                raise ValueError("speculative = 'draft' needs draft_model (a local model folder with the target's tokenizer)")
            draft_config = replace(config, model=config.draft_model, model_name=None, speculative=None,
                                   draft_model=None, max_model_len=None)
            runner = ModelRunner(draft_config)
        self.runner = runner
        self.block_size = runner.block_size
        assert runner.block_size == config.block_size and runner.num_blocks == config.num_kv_blocks, \
            "the draft cache must have the target's geometry"
        self.sampler = Sampler(config.seed)
        #: Stop a proposal at a token the draft gives less than this probability (0 = never):
        #: such tokens are mostly rejected, so drafting and verifying them is wasted work.
        self.min_confidence = min_confidence
        self._states: dict[int, _DraftState] = {}

    def _state(self, seq: Any) -> _DraftState:
        state = self._states.setdefault(seq.seq_id, _DraftState())
        num_blocks = -(-state.num_computed // self.block_size)
        if tuple(seq.block_table[:num_blocks]) != state.blocks[:num_blocks]:
            state.num_computed, state.blocks = 0, ()  # blocks changed (preempted): recompute
        return state

    def propose(self, seqs: list[Any], num_tokens: list[int]) -> list[Any]:
        import torch

        from tokenops.engine.batch import ChunkInput
        from tokenops.engine.spec_decode import Proposal

        proposals = [Proposal([], [] if not s.params.is_greedy else None) for s in seqs]
        states = [self._state(s) for s in seqs]
        active = [i for i, k in enumerate(num_tokens) if k > 0 and len(seqs[i].token_ids) <= self.runner.max_model_len - k]
        step = 0
        while active:
            chunks = []
            for i in active:
                seq, state, proposal = seqs[i], states[i], proposals[i]
                tokens = seq.token_ids + proposal.token_ids
                chunks.append(ChunkInput(tokens[state.num_computed:], state.num_computed, seq.block_table))
            logits = self.runner.execute(chunks)
            picked = self._pick(logits, [seqs[i] for i in active])
            confident = self._confident(logits, picked)
            stopped = set()
            for row, i in enumerate(active):
                token, probs = picked[row]
                states[i].num_computed = chunks[row].end_pos
                if not confident[row]:
                    stopped.add(i)
                    continue
                proposals[i].token_ids.append(token)
                if probs is not None:
                    proposals[i].probs.append(probs)
            step += 1
            active = [i for i in active if i not in stopped and len(proposals[i].token_ids) < num_tokens[i]]
        for seq, state, proposal in zip(seqs, states, proposals):
            state.blocks = tuple(seq.block_table[: -(-state.num_computed // self.block_size)])
            if isinstance(proposal.probs, list):
                proposal.probs = torch.stack(proposal.probs) if proposal.probs else None
        return proposals

    def _confident(self, logits: Any, picked: list[tuple[int, Any]]) -> list[bool]:
        if self.min_confidence <= 0:
            return [True] * len(picked)
        # greedy requests only: for sampled ones, a stop that depends on the drawn token
        # would change the proposal distribution the rejection sampler relies on
        probs = logits.float().softmax(dim=-1)
        return [q is not None or float(probs[row, t]) >= self.min_confidence for row, (t, q) in enumerate(picked)]

    def _pick(self, logits: Any, seqs: list[Any]) -> list[tuple[int, Any]]:
        import torch

        out: list[tuple[int, Any]] = []
        greedy = logits.argmax(dim=-1).tolist()
        for row, seq in enumerate(seqs):
            if seq.params.is_greedy:
                out.append((greedy[row], None))
                continue
            probs = self.sampler._probs(logits[row:row + 1].float(), [seq.params])[0].cpu()
            generator = seq.generator if seq.generator is not None else self.sampler.generator
            out.append((int(torch.multinomial(probs, 1, generator=generator)), probs))
        return out

    def on_verified(self, seq: Any, num_proposed: int, num_accepted: int) -> None:
        state = self._states.get(seq.seq_id)
        if state is None:
            return
        # valid: up to the decode token and the accepted proposals (positions < len + num_accepted)
        num_valid = len(seq.token_ids) + num_accepted
        if state.num_computed > num_valid:
            state.num_computed = num_valid
            state.blocks = state.blocks[: -(-num_valid // self.block_size)]

    def release(self, seq: Any) -> None:
        self._states.pop(seq.seq_id, None)

    def retain(self, seq_ids: set[int]) -> None:
        self._states = {i: s for i, s in self._states.items() if i in seq_ids}


@hookimpl
def tokenops_draft_proposer(config):
    if getattr(config, "speculative", None) != "draft":
        return None
    from tokenops_plugins.model_optimization.ngram_proposer import settings

    return DraftModelProposer(config, min_confidence=float(settings().get("draft_min_confidence", 0.0)))
