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
    """Whether a request's :class:`~tokenops.engine.sampling.SamplingParams` ask for any transform here."""
    return bool(params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0
                or params.logit_bias or params.min_tokens)


def _padded(lists: list[list[int]], device: Any) -> tuple["torch.Tensor", "torch.Tensor"]:
    """``lists`` as a ``[rows, longest]`` long tensor (padding 0) and its validity mask."""
    import torch

    width = max(1, max(len(x) for x in lists))
    ids = torch.zeros(len(lists), width, dtype=torch.long)
    valid = torch.zeros(len(lists), width, dtype=torch.bool)
    for r, x in enumerate(lists):
        if x:
            ids[r, :len(x)] = torch.tensor(x, dtype=torch.long)
            valid[r, :len(x)] = True
    return ids.to(device), valid.to(device)


def token_counts(lists: list[list[int]], vocab: int, device: Any) -> "torch.Tensor":
    """``[rows, vocab]`` float counts of each token id in each row's list."""
    import torch

    ids, valid = _padded(lists, device)
    counts = torch.zeros(len(lists), vocab, dtype=torch.float32, device=device)
    return counts.scatter_add_(1, ids, valid.float())


def apply_processors(logits: "torch.Tensor", seqs: Sequence[Any], eos_token_ids: Sequence[int]) -> "torch.Tensor":
    """``logits`` ``[rows, vocab]`` (float32) with each row's bias, min-tokens mask and penalties applied.

    ``seqs[i]`` is row i's sequence (``params``, ``token_ids``, ``num_prompt_tokens``); rows that ask
    for nothing are left as they are. Returns a new tensor when anything applies."""
    import torch

    rows = [i for i, s in enumerate(seqs) if needs_processing(s.params)]
    if not rows:
        return logits
    logits = logits.clone()
    vocab, device = logits.shape[1], logits.device
    _apply_logit_bias(logits, [(i, seqs[i].params.logit_bias) for i in rows if seqs[i].params.logit_bias])
    _apply_min_tokens(logits, [i for i in rows if seqs[i].num_output_tokens < seqs[i].params.min_tokens],
                      seqs, eos_token_ids)
    out_rows = [i for i in rows if seqs[i].params.presence_penalty or seqs[i].params.frequency_penalty]
    if out_rows:
        index = torch.tensor(out_rows, device=device)
        counts = token_counts([seqs[i].token_ids[seqs[i].num_prompt_tokens:] for i in out_rows], vocab, device)
        freq = torch.tensor([seqs[i].params.frequency_penalty for i in out_rows], device=device).unsqueeze(1)
        pres = torch.tensor([seqs[i].params.presence_penalty for i in out_rows], device=device).unsqueeze(1)
        logits.index_copy_(0, index, logits.index_select(0, index) - freq * counts - pres * (counts > 0).float())
    rep_rows = [i for i in rows if seqs[i].params.repetition_penalty != 1.0]
    if rep_rows:
        index = torch.tensor(rep_rows, device=device)
        seen = token_counts([seqs[i].token_ids for i in rep_rows], vocab, device) > 0
        penalty = torch.tensor([seqs[i].params.repetition_penalty for i in rep_rows], device=device).unsqueeze(1)
        part = logits.index_select(0, index)
        penalised = torch.where(part > 0, part / penalty, part * penalty)
        logits.index_copy_(0, index, torch.where(seen, penalised, part))
    return logits


def _apply_logit_bias(logits: "torch.Tensor", biased: list[tuple[int, dict[int, float]]]) -> None:
    import torch

    if not biased:
        return
    row_ids = [i for i, bias in biased for _ in bias]
    token_ids = [t for _, bias in biased for t in bias]
    values = [v for _, bias in biased for v in bias.values()]
    device = logits.device
    logits.index_put_((torch.tensor(row_ids, device=device), torch.tensor(token_ids, device=device)),
                      torch.tensor(values, dtype=logits.dtype, device=device), accumulate=True)


def _apply_min_tokens(logits: "torch.Tensor", rows: list[int], seqs: Sequence[Any],
                      eos_token_ids: Sequence[int]) -> None:
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
