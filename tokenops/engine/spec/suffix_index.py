"""A suffix array over a token corpus, and the most likely continuation of a context in it.

The ``suffix`` speculative proposer (:mod:`tokenops.engine.spec.suffix_proposer`) asks this index:
"where in the corpus does the longest suffix of this sequence occur, and what followed it most
often?". The suffix array orders every position of the corpus by the tokens that start there, so
all occurrences of a pattern are one contiguous range of it, and the tokens that follow them sit
sorted in that range: extending the pattern by one token is two binary searches, and the most
frequent next token is the longest run in a sorted column. Walking the most frequent continuation
token by token, with the share of the occurrences it keeps as its probability, is the same walk
SuffixDecoding (Oliaro et al., 2024) makes down its suffix tree, on a flat array instead of a tree.

Built with prefix doubling in numpy (ranks of 2^k-token prefixes, one ``argsort`` per doubling):
0.4 s for 400k tokens here; a compiled suffix sorter (libdivsufsort) would be faster, but the
index is built once per engine and the numpy version needs no extra dependency.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

#: Marks "past the end of the corpus" in the padded token column; below every token id, so
#: a suffix that ends sorts before the longer ones that share its tokens.
_END = -1


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Start positions of ``tokens``' suffixes in lexicographic order (shorter first on ties)."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = tokens.astype(np.int64)
    width = 1
    while True:
        second = np.full(n, _END, dtype=np.int64)
        second[: n - width] = rank[width:]
        key = rank * (n + 2) + (second + 1)  # rank < max(n, vocab) keeps this inside int64
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))
        if rank[order[-1]] == n - 1 or width >= n:  # every suffix has its own rank
            return order
        width *= 2


@dataclass(frozen=True, slots=True)
class MatchHint:
    """A context's longest match, kept to find the next one faster once the context has grown: the
    context's length and last token (to check the new context extends it), the match length (shorter
    than every cap, so the true longest) and its suffix-array range."""

    context_len: int
    last_token: int
    length: int
    lo: int
    hi: int
    min_count: int


@dataclass(frozen=True, slots=True)
class Continuation:
    """The most likely continuation of a context: its tokens, the probability of each token given
    the ones before it (its share of the occurrences), how many occurrences each share is of, and
    the context length matched."""

    tokens: list[int]
    probs: list[float]
    support: list[int]
    match_len: int
    #: the match as a hint for the same context grown by more tokens (``longest_match``), or None
    hint: MatchHint | None = None

    def smoothed(self, prior: float) -> list[float]:
        """Each token's share with ``prior`` pseudo-occurrences that continue otherwise: one of one
        occurrence is not the certainty that 50 of 50 are."""
        return [p * n / (n + prior) for p, n in zip(self.probs, self.support)]


class SuffixIndex:
    """Occurrences of token patterns in a corpus and the continuations that followed them."""

    def __init__(self, tokens: np.ndarray, vocab_size: int, max_walk: int = 64) -> None:
        tokens = np.asarray(tokens, dtype=np.int64)
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= vocab_size):
            raise ValueError(f"corpus token ids must lie in [0, {vocab_size}), got {tokens.min()}..{tokens.max()}")
        self.num_tokens = len(tokens)
        self.vocab_size = vocab_size
        self.max_walk = max_walk
        self._sa = suffix_array(tokens)
        # padded so that a position up to max_walk past the end reads _END
        self._col = np.concatenate((tokens, np.full(max_walk + 1, _END, dtype=np.int64)))
        self._sa_list: list[int] = self._sa.tolist()
        self._col_list: list[int] = self._col.tolist()
        counts = np.bincount(tokens, minlength=vocab_size)
        self._first = np.concatenate(([0], np.cumsum(counts)))  # token v starts at _first[v]

    def _refine(self, lo: int, hi: int, offset: int, token: int) -> tuple[int, int]:
        """The part of range [lo, hi) (suffixes sharing ``offset`` tokens) whose next token is ``token``:
        two binary searches over the range's (sorted) next tokens, reading only the ~2 log2(hi - lo)
        entries they probe (from Python lists: gathering the whole column with numpy cost ~12 us a
        call, several dozen calls a proposal)."""
        sa, col = self._sa_list, self._col_list

        def next_token(i: int) -> int:
            return col[sa[i] + offset]

        first = bisect.bisect_left(range(lo, hi), token, key=next_token)
        return lo + first, lo + bisect.bisect_right(range(lo + first, hi), token, key=next_token) + first

    def find(self, pattern: list[int]) -> tuple[int, int]:
        """The suffix-array range of ``pattern``'s occurrences (empty: lo == hi)."""
        if not pattern or not 0 <= pattern[0] < self.vocab_size:
            return 0, 0
        lo, hi = int(self._first[pattern[0]]), int(self._first[pattern[0] + 1])
        for offset, token in enumerate(pattern[1:], 1):
            if hi - lo == 0:
                break
            lo, hi = self._refine(lo, hi, offset, token)
        return lo, hi

    def longest_match(
        self, context: list[int], max_len: int, min_count: int = 1, hint: MatchHint | None = None
    ) -> tuple[int, int, int]:
        """The longest suffix of ``context`` (at most ``max_len`` tokens) occurring at least
        ``min_count`` times with a token after it: (length, lo, hi); length 0 when none does.

        ``hint``: the longest match of a shorter context this one extends by n tokens. Its occurrences
        bound the new match to at most its length + n (a longer suffix's first tokens would be a
        longer match of the old context), so the old range refined by the n new tokens is the answer
        when it still occurs; else the search runs below that bound. Same result as without it."""
        best = (0, 0, 0)
        low, high = 1, min(max_len, len(context), self.max_walk)
        if (
            hint is not None
            and hint.min_count == min_count
            and 0 < hint.context_len <= len(context)
            and context[hint.context_len - 1] == hint.last_token
        ):
            grown = len(context) - hint.context_len
            if hint.length + grown <= high:
                lo, hi = (hint.lo, hint.hi) if hint.length else (0, self.num_tokens)  # 0: the empty pattern
                for offset, token in enumerate(context[hint.context_len :], hint.length):
                    if hi <= lo:
                        break
                    lo, hi = self._refine(lo, hi, offset, token)
                if hint.length + grown == 0:
                    return best
                if self._followed(lo, hi, hint.length + grown) >= min_count:
                    return hint.length + grown, lo, hi
                high = hint.length + grown - 1
        while low <= high:  # a suffix occurs whenever a longer one does: binary search the length
            mid = (low + high) // 2
            lo, hi = self.find(context[len(context) - mid :])
            if self._followed(lo, hi, mid) >= min_count:
                best, low = (mid, lo, hi), mid + 1
            else:
                high = mid - 1
        return best

    def _followed(self, lo: int, hi: int, offset: int) -> int:
        """How many of the range's occurrences have a token after the pattern (not the corpus end)."""
        if hi <= lo:
            return 0
        return hi - self._refine(lo, hi, offset, _END)[1]

    def continuation(
        self,
        context: list[int],
        num_tokens: int,
        max_match: int = 16,
        min_count: int = 2,
        hint: MatchHint | None = None,
    ) -> Continuation:
        """Walk the most frequent continuation after the longest matching suffix of ``context``:
        up to ``num_tokens`` tokens, stopping where a step has fewer than ``min_count`` occurrences
        (how many of the tokens to propose is the caller's choice, from the shares). ``hint``: the
        ``hint`` of an earlier continuation of a context this one extends (``longest_match``); the
        result carries one for the next call, None where a cap cut the match (it may be longer)."""
        length, lo, hi = self.longest_match(context, max_match, min_count, hint)
        uncapped = length < min(max_match, len(context), self.max_walk)
        new_hint = MatchHint(len(context), context[-1], length, lo, hi, min_count) if uncapped and context else None
        if length == 0:
            return Continuation([], [], [], 0, new_hint)
        tokens: list[int] = []
        probs: list[float] = []
        support: list[int] = []
        offset = length
        while len(tokens) < num_tokens and offset < self.max_walk:
            token, count, total = self._most_frequent(lo, hi, offset)
            if total < min_count:
                break
            tokens.append(token)
            probs.append(count / total)
            support.append(total)
            lo, hi = self._refine(lo, hi, offset, token)
            offset += 1
        return Continuation(tokens, probs, support, length, new_hint)

    def _most_frequent(self, lo: int, hi: int, offset: int) -> tuple[int, int, int]:
        """The most frequent token after the range's patterns (the first of the sorted column on ties),
        its count, and how many occurrences have a next token."""
        if hi - lo <= 64:  # few occurrences (most walks past their first token): plain Python is faster
            sa, col = self._sa_list, self._col_list
            column = [col[sa[i] + offset] for i in range(lo, hi)]
            column = column[bisect.bisect_right(column, _END) :]
            best, best_count, run = -1, 0, 0
            for i, tok in enumerate(column):
                run = run + 1 if i and tok == column[i - 1] else 1
                if run > best_count:
                    best, best_count = tok, run
            return best, best_count, len(column)
        array = self._col[self._sa[lo:hi] + offset]
        array = array[np.searchsorted(array, _END, "right") :]  # occurrences with a next token
        if not len(array):
            return -1, 0, 0
        starts = np.flatnonzero(np.concatenate(([True], array[1:] != array[:-1])))
        runs = np.diff(np.append(starts, len(array)))
        best_run = int(np.argmax(runs))
        return int(array[starts[best_run]]), int(runs[best_run]), len(array)
