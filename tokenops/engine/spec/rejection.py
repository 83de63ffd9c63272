"""Speculative-decoding verification: which proposed tokens the target keeps.

Given the target's probabilities at the ``k + 1`` positions of a verify chunk and
``k`` proposed tokens (with the proposer's probabilities, or none for a proposer
whose draft is deterministic), :func:`verify_proposal` returns the accepted prefix
plus one more token, so every round emits between 1 and ``k + 1`` tokens.

- Greedy requests: a proposed token is accepted while it equals the target's
  argmax; the extra token is the target's argmax where the first mismatch (or the
  bonus position) is. The output is exactly plain greedy decoding.
- Sampled requests: strict rejection sampling (Leviathan et al. 2023, Chen et al.
  2023). Token ``x`` proposed with probability ``q(x)`` is accepted with probability
  ``min(1, p(x) / q(x))``; on rejection the replacement is drawn from
  ``normalize(max(0, p - q))``; when all ``k`` are accepted a bonus token is drawn
  from ``p`` at the last position. Each emitted token is then distributed exactly
  as the target's ``p``. A deterministic proposer (n-gram) has ``q`` one-hot on its
  token: accept with probability ``p(x)``, else draw from ``p`` with ``x`` removed.

Random draws come from the request's own generator when it has a seed, so seeded
requests are reproducible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenops.engine.sampling.sampling import argmax_rows

if TYPE_CHECKING:
    import torch


def verify_proposal(
    target_probs: torch.Tensor,
    draft_token_ids: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> list[int]:
    """Accepted proposed tokens followed by one token drawn from the target.

    :param target_probs: ``[k + 1, vocab]`` target probabilities (after temperature,
        top-k, top-p) at the positions that predict proposal 1..k and the bonus token.
    :param draft_token_ids: the ``k`` proposed tokens.
    :param draft_probs: ``[k, vocab]`` probabilities the proposer drew them from, or
        None for a deterministic proposer (one-hot ``q``).
    :param generator: CPU generator for the draws (None: torch's default).
    """
    import torch

    num_draft = len(draft_token_ids)
    assert target_probs.shape[0] == num_draft + 1, (target_probs.shape, num_draft)
    p = target_probs.float().cpu()
    q = None if draft_probs is None else draft_probs.float().cpu()
    accepted: list[int] = []
    for i, token in enumerate(draft_token_ids):
        p_x = float(p[i, token])
        q_x = 1.0 if q is None else float(q[i, token])
        u = float(torch.rand((), generator=generator))
        if q_x > 0 and u * q_x < p_x:  # u < p/q without dividing
            accepted.append(token)
            continue
        if q is None:
            residual = p[i].clone()
            residual[token] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_(min=0.0)
        total = float(residual.sum())
        # a rejection has residual mass > 0; float noise can leave none, then p itself is exact
        dist = residual / total if total > 1e-12 else p[i]
        accepted.append(_draw_one(dist, generator))
        return accepted
    accepted.append(_draw_one(p[num_draft], generator))
    return accepted


def _draw_one(dist: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a probability vector (inverse CDF, as the sampler draws)."""
    import torch

    from tokenops.engine.sampling.sampling import draw

    u = torch.rand(1, generator=generator, dtype=torch.float64)
    return int(draw(dist.unsqueeze(0).cpu(), u)[0])


def verify_greedy(target_logits: torch.Tensor, draft_token_ids: list[int]) -> list[int]:
    """Greedy verification: accepted tokens (equal to the target's argmax) plus the
    target's argmax at the first mismatch or the bonus position."""
    best = argmax_rows(target_logits)
    assert len(best) == len(draft_token_ids) + 1
    out: list[int] = []
    for token, target in zip(draft_token_ids, best):
        if token != target:
            out.append(target)
            return out
        out.append(token)
    out.append(best[-1])
    return out
