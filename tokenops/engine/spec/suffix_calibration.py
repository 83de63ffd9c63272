"""Acceptance tables for the ``suffix`` proposer, measured on a corpus' own prompts.

Greedy output does not depend on speculation, so the corpus answers are exactly what the target
would accept: replaying each position of an answer, the proposer's two candidates (prompt lookup on
prompt + answer so far, the corpus walk) can be checked token by token against the answer's next
tokens without running the model. Cross-fitted: the answers are split into ``folds`` groups and
each group is replayed against an index of the other answers, so a walk never finds the answer it
is predicting (as on a new prompt). Each table cell is ``(accepted + 1) / (reached + 4)``: a token
is "reached" when every token before it in its proposal was accepted; the prior keeps rare cells
near a quarter, where they would not be proposed. Along the share axis the corpus table is made
non-decreasing (weighted isotonic regression), since a token most occurrences agree on is never
less likely to be accepted than one fewer agree on; sparse cells then follow their neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenops.engine.spec.proposers import NgramProposer
from tokenops.engine.spec.suffix_index import SuffixIndex
from tokenops.engine.spec.suffix_proposer import (
    CORPUS_POSITIONS,
    MATCH_BUCKETS,
    OWN_MAX_MATCH,
    OWN_POSITIONS,
    SHARE_BUCKETS,
    AcceptanceTables,
    match_bucket,
    share_bucket,
)

PRIOR_ACCEPTED, PRIOR_REACHED = 1, 4


def split_answers(tokens: np.ndarray, stop_ids: Sequence[int]) -> list[list[int]]:
    """The answers of a flat corpus, each ending with its stop token."""
    ends = np.flatnonzero(np.isin(tokens, list(stop_ids)))
    starts = np.concatenate(([0], ends[:-1] + 1))
    return [tokens[s : e + 1].tolist() for s, e in zip(starts, ends)]


def _accepted(proposal: list[int], answer: list[int], at: int) -> int:
    """How many of ``proposal``'s tokens the answer continues with at position ``at``."""
    count = 0
    while count < len(proposal) and at + count < len(answer) and proposal[count] == answer[at + count]:
        count += 1
    return count


def _add(cells: list[np.ndarray], accepted: int) -> None:
    """Count each cell of a proposal's tokens as reached up to the first rejected one."""
    for j, cell in enumerate(cells[: accepted + 1]):
        cell[0] += 1
        cell[1] += j < accepted


def calibrate(
    prompts: list[list[int]],
    answers: list[list[int]],
    vocab_size: int,
    folds: int = 4,
    max_answers: int = 400,
    num_tokens: int = OWN_POSITIONS,
) -> AcceptanceTables:
    """The acceptance tables of the first ``max_answers`` answers (module doc)."""
    own = np.zeros((OWN_MAX_MATCH, OWN_POSITIONS, 2), dtype=np.int64)  # [..., reached / accepted]
    corpus = np.zeros((SHARE_BUCKETS, len(MATCH_BUCKETS) + 1, CORPUS_POSITIONS, 2), dtype=np.int64)
    lookup = NgramProposer(1, 8)
    replayed = min(max_answers, len(answers))
    for fold in range(folds):
        held = set(range(fold, replayed, folds))
        rest = [t for i, answer in enumerate(answers) if i not in held for t in answer]
        index = SuffixIndex(np.asarray(rest, dtype=np.int64), vocab_size)
        for i in sorted(held):
            answer = answers[i]
            for at in range(1, len(answer) - 1):
                context = prompts[i] + answer[:at]
                tokens, match_len = lookup.lookup(context, num_tokens)
                if tokens:
                    row = own[min(match_len, OWN_MAX_MATCH) - 1]
                    _add([row[min(j, OWN_POSITIONS - 1)] for j in range(len(tokens))], _accepted(tokens, answer, at))
                walk = index.continuation(context, num_tokens, min_count=1)
                column = match_bucket(walk.match_len)
                cells = [
                    corpus[share_bucket(share), column, min(j, CORPUS_POSITIONS - 1)]
                    for j, share in enumerate(walk.smoothed(1.0))
                ]
                _add(cells, _accepted(walk.tokens, answer, at))

    own_rates = (own[..., 1] + PRIOR_ACCEPTED) / (own[..., 0] + PRIOR_REACHED)
    corpus_rates = (corpus[..., 1] + PRIOR_ACCEPTED) / (corpus[..., 0] + PRIOR_REACHED)
    for column in range(corpus_rates.shape[1]):  # a larger share is never less likely to be accepted
        for j in range(CORPUS_POSITIONS):
            weights = corpus[:, column, j, 0] + PRIOR_REACHED
            corpus_rates[:, column, j] = monotone(corpus_rates[:, column, j], weights)
    return AcceptanceTables(_rounded(own_rates), _rounded(corpus_rates))


def _rounded(rates: np.ndarray) -> Any:
    return np.round(rates, 4).tolist()


def monotone(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest to ``values`` in weighted least squares (pool adjacent
    violators): a share bucket with few samples takes its neighbours' rate instead of its noise."""
    blocks: list[list[float]] = []  # [weighted mean, weight, length]
    for value, weight in zip(values.tolist(), weights.tolist()):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            last = blocks.pop()
            prev = blocks[-1]
            total = prev[1] + last[1]
            blocks[-1] = [(prev[0] * prev[1] + last[0] * last[1]) / total, total, prev[2] + last[2]]
    return np.array([mean for mean, _, length in blocks for _ in range(int(length))])
