"""Logprobs of a prompt's own tokens (``SamplingParams.prompt_logprobs``): what scoring clients
(lm-eval's loglikelihood tasks, via ``/v1/completions`` with ``echo`` and ``logprobs``) read.

A prefill chunk of such a sequence asks the runner for logits at every position instead of the
last only (``ChunkInput.num_logits``); the logits at position ``p`` give the logprob of prompt token
``p + 1``. The first prompt token has none (``None``, as vLLM and OpenAI report it). The prompt of such
a request skips the prefix cache (a cached block has no logits), and a recompute after preemption
does not record them twice. Values are ``log_softmax`` of the model's logits, as sampled logprobs are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenops.engine.sampling.sampling import SampledToken

if TYPE_CHECKING:
    import torch

    from tokenops.engine.core.scheduler import ScheduledChunk
    from tokenops.engine.core.sequence import Sequence


def wants_prompt_logits(seq: Sequence) -> bool:
    """Whether ``seq``'s prompt still lacks logprobs (its prefill chunks need logits at every position)."""
    return seq.prompt_logprobs is not None and len(seq.prompt_logprobs) < seq.num_prompt_tokens


def record_prompt_logprobs(
    logits: torch.Tensor, chunks: list[ScheduledChunk], entry: Callable[[SampledToken], dict[str, Any]]
) -> None:
    """Append to each chunk's ``seq.prompt_logprobs`` the entries its rows give (``chunk.row`` ..
    ``chunk.row + chunk.num_logits - 1`` of ``logits``, one per position of the chunk).

    ``entry`` turns a :class:`SampledToken` into the engine's logprob entry (the output processor's)."""
    import torch

    for chunk in chunks:
        seq = chunk.seq
        if seq.prompt_logprobs is None or chunk.num_logits != chunk.num_tokens:
            continue
        first_target = chunk.start_pos + 1  # the row of position p scores token p + 1
        start = len(seq.prompt_logprobs) - first_target  # rows already recorded (a recompute) are skipped
        stop = min(chunk.num_tokens, seq.num_prompt_tokens - first_target)
        if start < 0 or start >= stop:
            continue
        rows = logits[chunk.row + start : chunk.row + stop].float().log_softmax(dim=-1)
        targets = torch.tensor(seq.token_ids[first_target + start : first_target + stop], device=rows.device)
        chosen = rows.gather(1, targets.unsqueeze(1)).view(-1).tolist()
        k = seq.params.prompt_logprobs or 0
        if k:
            top_vals, top_ids = rows.topk(k, dim=-1)
            tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_vals.tolist())]
        else:
            tops = [[] for _ in chosen]
        for token_id, logprob, top in zip(targets.tolist(), chosen, tops):
            seq.prompt_logprobs.append(entry(SampledToken(token_id, logprob, top)))
