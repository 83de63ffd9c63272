"""Acceptance tables for the ``suffix`` proposer, measured on a corpus' own prompts.

Greedy output does not depend on speculation, so the corpus answers are exactly what the target
would accept: replaying each position of an answer, the proposer's two candidates (prompt lookup on
prompt + answer so far, the corpus walk) can be checked token by token against the answer's next
tokens without running the model. Cross-fitted: the answers are split into ``folds`` groups and
each group is replayed against an index of the other answers, so a walk never finds the answer it
is predicting (as on a new prompt). Each table cell is ``(accepted + 1) / (reached + 4)``: a token
is "reached" when every token before it in its proposal was accepted; the prior keeps rare cells
near a fifth, where they would not be proposed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenops.engine.proposers import NgramProposer
from tokenops.engine.suffix_index import SuffixIndex
from tokenops.engine.suffix_proposer import (
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
    corpus = np.zeros((SHARE_BUCKETS, len(MATCH_BUCKETS) + 1, 2), dtype=np.int64)
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
                row = own[min(match_len, OWN_MAX_MATCH) - 1]
                _add([row[min(j, OWN_POSITIONS - 1)] for j in range(len(tokens))], _accepted(tokens, answer, at))
                walk = index.continuation(context, num_tokens, min_count=1)
                column = match_bucket(walk.match_len)
                cells = [corpus[share_bucket(share), column] for share in walk.smoothed(1.0)]
                _add(cells, _accepted(walk.tokens, answer, at))

    def table(counts: np.ndarray) -> list[list[float]]:
        rates = (counts[..., 1] + PRIOR_ACCEPTED) / (counts[..., 0] + PRIOR_REACHED)
        return [[round(float(x), 4) for x in row] for row in rates]

    return AcceptanceTables(table(own), table(corpus))
