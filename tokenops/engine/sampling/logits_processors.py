"""The logits transforms a request can ask for besides temperature and top-k/top-p: ``logit_bias``,
``min_tokens``, and the presence, frequency and repetition penalties.

They run on the step's logits, one batched tensor operation per transform over the rows that asked
for it, after the grammar and thinking masks and before greedy/random selection (the order vLLM
uses), so a masked token stays masked: a penalty or a bias moves a logit of ``-inf`` nowhere.
Logprobs are reported from the logits before these transforms, as vLLM's default ``raw_logprobs``.

- ``logit_bias`` (OpenAI): a value in [-100, 100] added to a token's logit.
- ``min_tokens`` (vLLM's extension): end-of-sequence and ``stop_token_ids`` get ``-inf`` while
  fewer than ``min_tokens`` tokens were generated. A row whose every token would then be ``-inf``
  (a grammar that only allows end-of-sequence) keeps its logits: an impossible row never samples.
- ``presence_penalty`` / ``frequency_penalty`` (OpenAI, in [-2, 2]): subtracted from the logit of each
  token already *generated*: ``presence * (count > 0) + frequency * count``.
- ``repetition_penalty`` (vLLM's extension, > 0, 1 = off; Keskar et al. 2019 as in Hugging Face's
  ``RepetitionPenaltyLogitsProcessor``): every token seen in the prompt *or* the output has its logit
  divided by the penalty when positive, multiplied by it when negative.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def needs_processing(params: Any) -> bool:
    """Whether a request's :class:`~tokenops.engine.sampling.sampling.SamplingParams` ask for any transform here."""
    return bool(
        params.presence_penalty
        or params.frequency_penalty
        or params.repetition_penalty != 1.0
        or params.logit_bias
        or params.min_tokens
    )


def _flat(per_row: list[tuple[int, list[Any]]], device: Any, dtype: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices and values of ``[(row, values)]`` as two flat tensors (through numpy: a Python list
    becomes a tensor several times faster that way)."""
    import numpy as np
    import torch

    rows = np.repeat(np.array([r for r, _ in per_row], dtype=np.int64), [len(v) for _, v in per_row])
    values = np.concatenate([np.asarray(v, dtype=np.float32 if dtype is not None else np.int64) for _, v in per_row])
    return torch.from_numpy(rows).to(device), torch.from_numpy(values).to(device=device, dtype=dtype)


def apply_processors(logits: torch.Tensor, seqs: Sequence[Any], eos_token_ids: Sequence[int]) -> torch.Tensor:
    """``logits`` ``[rows, vocab]`` (float32) with each row's bias, min-tokens mask and penalties applied.

    ``seqs[i]`` is row i's sequence (``params``, ``token_ids``, ``num_prompt_tokens``); rows that ask
    for nothing are left as they are. Returns a new tensor when anything applies. Past that one copy,
    every operation touches only the tokens a row has seen (indexed gathers and adds over the flat
    ``(row, token)`` pairs), never a whole ``[rows, vocab]`` pass (``tests/benchmarks/penalties_speed.py``)."""
    import torch

    rows = [i for i, s in enumerate(seqs) if needs_processing(s.params)]
    if not rows:
        return logits
    logits = logits.clone()
    device = logits.device
    _apply_logit_bias(logits, [(i, seqs[i].params.logit_bias) for i in rows if seqs[i].params.logit_bias])
    _apply_min_tokens(
        logits, [i for i in rows if seqs[i].num_output_tokens < seqs[i].params.min_tokens], seqs, eos_token_ids
    )
    ids: list[tuple[int, list[int]]] = []
    values: list[tuple[int, list[float]]] = []
    for i in rows:  # one indexed add: -frequency per occurrence of an output token, -presence once per distinct one
        params = seqs[i].params
        if params.presence_penalty or params.frequency_penalty:
            output = seqs[i].token_ids[seqs[i].num_prompt_tokens :]
            distinct = list(set(output))
            ids.append((i, output + distinct))
            values.append((i, [-params.frequency_penalty] * len(output) + [-params.presence_penalty] * len(distinct)))
    if any(v for _, v in ids):
        row_ids, token_ids = _flat(ids, device)
        logits.index_put_((row_ids, token_ids), _flat(values, device, logits.dtype)[1], accumulate=True)
    seen = [(i, list(set(seqs[i].token_ids))) for i in rows if seqs[i].params.repetition_penalty != 1.0]
    if seen:
        row_ids, token_ids = _flat(seen, device)
        penalty = _flat([(i, [seqs[i].params.repetition_penalty] * len(t)) for i, t in seen], device, logits.dtype)[1]
        vals = logits[row_ids, token_ids]
        logits[row_ids, token_ids] = torch.where(vals > 0, vals / penalty, vals * penalty)
    return logits


def _apply_logit_bias(logits: torch.Tensor, biased: list[tuple[int, dict[int, float]]]) -> None:
    import torch

    if not biased:
        return
    row_ids = [i for i, bias in biased for _ in bias]
    token_ids = [t for _, bias in biased for t in bias]
    values = [v for _, bias in biased for v in bias.values()]
    device = logits.device
    logits.index_put_(
        (torch.tensor(row_ids, device=device), torch.tensor(token_ids, device=device)),
        torch.tensor(values, dtype=logits.dtype, device=device),
        accumulate=True,
    )


def _apply_min_tokens(logits: torch.Tensor, rows: list[int], seqs: Sequence[Any], eos_token_ids: Sequence[int]) -> None:
    vocab = logits.shape[1]
    for i in rows:
        params = seqs[i].params
        banned = [t for t in (*([] if params.ignore_eos else eos_token_ids), *params.stop_token_ids) if 0 <= t < vocab]
        if not banned:
            continue
        row = logits[i].clone()
        row[banned] = float("-inf")
        if bool(row.isfinite().any()):  # a row with nothing left keeps its logits (a grammar that must end)
            logits[i] = row
