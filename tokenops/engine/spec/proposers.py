"""The built-in speculative proposers: n-gram prompt lookup and a draft model.

Both implement :class:`tokenops.engine.core.protocols.Proposer` and are the engine's defaults
for ``speculative = "ngram"`` and ``"draft"`` (:data:`tokenops.engine.core.policies.BUILTIN_PROPOSERS`);
the ``ngram_proposer`` / ``draft_proposer`` plugins register them again with the
``[plugins.speculative]`` settings applied.

**n-gram (prompt lookup).** Matches the last ``n`` tokens of a sequence (``n`` from
``max_ngram`` down to ``min_ngram``) against earlier positions of the same sequence and
proposes the tokens that followed the most recent match. No model forward: it pays off
whenever outputs repeat their context (code editing, quoting summaries).

**Draft model.** A second, smaller model with the target's tokenizer runs in its own
:class:`~tokenops.engine.core.model_runner.ModelRunner` whose paged KV cache has the SAME
geometry as the target's (block size and number of blocks), so a sequence's target block
table addresses the draft cache too and no second block manager is needed. Per sequence
the proposer remembers how many positions the draft cache holds (``num_computed``) and the
block ids they live in. Each round it first catches up (one chunk over the tokens the draft
has not seen), then runs ``k - 1`` more single-token steps, batched over all sequences.
After verification only accepted positions stay valid, so ``num_computed`` is cut back;
if the sequence's blocks changed (preempted and recomputed) the draft starts over.
Greedy requests get the draft's argmax; sampled requests draw from the draft's
distribution and hand it to the rejection sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tokenops.engine.core.protocols import Proposal

if TYPE_CHECKING:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.sequence import Sequence


class NgramProposer:
    """Prompt-lookup proposals (see the module doc); stateless, so nothing to roll back."""

    vocab_size: int | None = None  # proposes tokens the sequence already holds

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram

    def find(self, tokens: list[int], num_tokens: int) -> list[int]:
        """The up to ``num_tokens`` tokens that followed the latest earlier occurrence of
        the longest matching suffix of ``tokens`` (empty when none matches)."""
        return self.lookup(tokens, num_tokens)[0]

    def lookup(self, tokens: list[int], num_tokens: int) -> tuple[list[int], int]:
        """:meth:`find`'s tokens and the length of the suffix matched (0: none)."""
        length = len(tokens)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            suffix = tokens[length - n :]
            first = suffix[0]
            # latest start i < length - n with tokens[i:i+n] == suffix
            i = length - n - 1
            while i >= 0:
                if tokens[i] == first and tokens[i : i + n] == suffix:
                    return tokens[i + n : i + n + num_tokens], n
                i -= 1
        return [], 0

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Proposal]:
        return [Proposal(self.find(seq.token_ids, k)) for seq, k in zip(seqs, num_tokens)]

    def on_verified(self, seq: Sequence, num_proposed: int, num_accepted: int) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass

    def retain(self, seq_ids: set[int]) -> None:
        pass


@dataclass(slots=True)
class _DraftState:
    num_computed: int = 0
    blocks: tuple[int, ...] = ()  # block ids holding positions [0, num_computed)


class DraftModelProposer:
    """Proposals from a draft model sharing the target's block tables."""

    def __init__(self, config: EngineConfig, runner: Any = None, min_confidence: float = 0.0) -> None:
        from tokenops.engine.core.model_runner import ModelRunner
        from tokenops.engine.sampling.sampling import Sampler

        if runner is None:
            if not config.draft_model:
                raise ValueError(
                    "speculative = 'draft' needs draft_model (a local model folder with the target's tokenizer)"
                )
            from tokenops.engine.kernels.panels import PanelDtypeUnavailable

            # draft_panel_dtype is the fused step's: with that step off by config the draft keeps its weights
            panel_dtype = "float32" if config.decode_kernel == "torch" else config.draft_panel_dtype
            draft_config = replace(
                config,
                model=config.draft_model,
                model_name=None,
                speculative=None,
                draft_model=None,
                max_model_len=None,
                panel_dtype=panel_dtype,
            )
            try:
                runner = ModelRunner(draft_config)
            except PanelDtypeUnavailable:  # a draft the fused step cannot run (logged): its weights, as loaded
                runner = ModelRunner(replace(draft_config, panel_dtype="float32"))
        self.runner = runner
        self.vocab_size: int | None = runner.vocab_size
        self.block_size = runner.block_size
        assert runner.block_size == config.block_size and runner.num_blocks == config.num_kv_blocks, (
            "the draft cache must have the target's geometry"
        )
        self.sampler = Sampler(config.seed)
        #: Stop a proposal at a token the draft gives less than this probability (0 = never):
        #: such tokens are mostly rejected, so drafting and verifying them is wasted work.
        self.min_confidence = min_confidence
        self._states: dict[int, _DraftState] = {}

    def _state(self, seq: Sequence) -> _DraftState:
        state = self._states.setdefault(seq.seq_id, _DraftState())
        num_blocks = -(-state.num_computed // self.block_size)
        if tuple(seq.block_table[:num_blocks]) != state.blocks[:num_blocks]:
            state.num_computed, state.blocks = 0, ()  # blocks changed (preempted): recompute
        return state

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Proposal]:
        import torch

        from tokenops.engine.core.batch import ChunkInput

        proposals = [Proposal([], [] if not s.params.is_greedy else None) for s in seqs]
        states = [self._state(s) for s in seqs]
        active = [
            i for i, k in enumerate(num_tokens) if k > 0 and len(seqs[i].token_ids) <= self.runner.max_model_len - k
        ]
        fused = getattr(self.runner, "fused_decode", None)
        greedy = all(s.params.is_greedy for s in seqs)
        while active:
            chunks = []
            for i in active:
                seq, state, proposal = seqs[i], states[i], proposals[i]
                tokens = seq.token_ids + proposal.token_ids
                chunks.append(ChunkInput(tokens[state.num_computed :], state.num_computed, seq.block_table))
            if greedy and fused is not None and fused.accepts(chunks):
                # the remaining steps in one native call: no return to Python per drafted token
                left = [num_tokens[i] - len(proposals[i].token_ids) for i in active]
                drafted, steps = fused.draft_greedy(chunks, left, self.min_confidence)
                self.runner.num_fused_steps += max(steps)
                for row, i in enumerate(active):
                    proposals[i].token_ids.extend(drafted[row])
                    states[i].num_computed = chunks[row].end_pos + steps[row] - 1
                break
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

    def _pick(self, logits: Any, seqs: list[Sequence]) -> list[tuple[int, Any]]:
        import torch

        out: list[tuple[int, Any]] = []
        greedy = logits.argmax(dim=-1).tolist()
        for row, seq in enumerate(seqs):
            if seq.params.is_greedy:
                out.append((greedy[row], None))
                continue
            probs = self.sampler.probs(logits[row : row + 1].float(), [seq.params])[0].cpu()
            generator = seq.generator if seq.generator is not None else self.sampler.generator
            out.append((int(torch.multinomial(probs, 1, generator=generator)), probs))
        return out

    def on_verified(self, seq: Sequence, num_proposed: int, num_accepted: int) -> None:
        state = self._states.get(seq.seq_id)
        if state is None:
            return
        # valid: up to the decode token and the accepted proposals (positions < len + num_accepted)
        num_valid = len(seq.token_ids) + num_accepted
        if state.num_computed > num_valid:
            state.num_computed = num_valid
            state.blocks = state.blocks[: -(-num_valid // self.block_size)]

    def release(self, seq: Sequence) -> None:
        self._states.pop(seq.seq_id, None)

    def retain(self, seq_ids: set[int]) -> None:
        self._states = {i: s for i, s in self._states.items() if i in seq_ids}
