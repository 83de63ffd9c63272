"""Synthetic workloads: prompts of chosen token lengths, and shared system prompts."""

from __future__ import annotations

import numpy as np

from tokenops.bench.request import BenchRequest, WorkloadError

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")

# Short common words: almost every BPE vocabulary encodes " word" as one token,
# so a prompt of N words is close to N tokens on any model.
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
    "or",
    "had",
    "by",
    "word",
    "but",
    "what",
    "some",
    "we",
    "can",
    "out",
    "other",
    "were",
    "all",
    "there",
    "when",
    "up",
    "use",
    "your",
    "how",
    "said",
    "an",
    "each",
    "she",
    "which",
    "do",
    "their",
    "time",
    "if",
    "will",
    "way",
    "about",
    "many",
    "then",
    "them",
    "write",
    "would",
    "like",
    "so",
    "these",
    "her",
    "long",
    "make",
    "thing",
    "see",
    "him",
    "two",
    "has",
    "look",
    "more",
    "day",
    "could",
    "go",
    "come",
    "did",
    "number",
    "sound",
    "no",
    "most",
    "people",
    "my",
    "over",
    "know",
    "water",
    "than",
    "call",
    "first",
    "who",
    "may",
    "down",
    "side",
    "been",
    "now",
    "find",
    "any",
    "new",
    "work",
    "part",
    "take",
    "get",
    "place",
    "made",
    "live",
    "where",
    "after",
    "back",
    "little",
    "only",
    "round",
    "man",
    "year",
    "came",
    "show",
    "every",
    "good",
    "me",
    "give",
    "our",
    "under",
    "name",
    "very",
    "through",
    "just",
    "form",
    "great",
    "think",
    "say",
    "help",
    "low",
    "line",
    "turn",
    "cause",
    "much",
    "mean",
    "before",
    "move",
    "right",
    "boy",
    "old",
    "too",
    "same",
    "tell",
    "does",
    "set",
    "three",
    "want",
    "air",
    "well",
    "also",
    "play",
    "small",
    "end",
    "put",
    "home",
    "read",
    "hand",
    "port",
    "large",
    "spell",
    "add",
    "even",
    "land",
    "here",
]


def lengths(num: int, mean: int, dist: str, spread: float, rng: np.random.Generator, minimum: int = 1) -> list[int]:
    """``num`` integer lengths with the given mean; ``spread`` is the relative std
    (normal, lognormal) or the relative half-width (uniform)."""
    if dist not in DISTRIBUTIONS:
        raise WorkloadError(f"unknown length distribution {dist!r}; use one of {', '.join(DISTRIBUTIONS)}")
    if mean < minimum:
        raise WorkloadError(f"mean length must be >= {minimum}, got {mean}")
    if dist == "fixed" or spread <= 0:
        vals = np.full(num, float(mean))
    elif dist == "uniform":
        vals = rng.uniform(mean * (1 - spread), mean * (1 + spread), num)
    elif dist == "normal":
        vals = rng.normal(mean, mean * spread, num)
    else:
        sigma = np.sqrt(np.log1p(spread**2))
        vals = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, num)
    return [max(minimum, int(round(v))) for v in vals]


def words(num_tokens: int, rng: np.random.Generator) -> str:
    """Text of about ``num_tokens`` tokens."""
    return " ".join(rng.choice(_WORDS, size=num_tokens))


def synthetic(
    num_requests: int,
    seed: int = 0,
    input_len: int = 128,
    output_len: int = 64,
    length_dist: str = "fixed",
    length_spread: float = 0.25,
    **_: object,
) -> list[BenchRequest]:
    """Random-word prompts of ``input_len`` tokens asking for ``output_len`` tokens."""
    rng = np.random.default_rng(seed)
    ins = lengths(num_requests, input_len, length_dist, length_spread, rng)
    outs = lengths(num_requests, output_len, length_dist, length_spread, rng)
    return [
        BenchRequest([{"role": "user", "content": words(n, rng)}], max_tokens=m, num_prompt_tokens=n)
        for n, m in zip(ins, outs)
    ]


def shared_prefix(
    num_requests: int,
    seed: int = 0,
    input_len: int = 64,
    output_len: int = 64,
    prefix_len: int = 256,
    num_prefixes: int = 4,
    length_dist: str = "fixed",
    length_spread: float = 0.25,
    **_: object,
) -> list[BenchRequest]:
    """``num_prefixes`` common system prompts of ``prefix_len`` tokens, each request
    adding its own ``input_len``-token question (exercises prefix caching)."""
    if num_prefixes < 1:
        raise WorkloadError(f"num_prefixes must be >= 1, got {num_prefixes}")
    rng = np.random.default_rng(seed)
    prefixes = [f"System prompt {i}: " + words(prefix_len, rng) for i in range(num_prefixes)]
    ins = lengths(num_requests, input_len, length_dist, length_spread, rng)
    outs = lengths(num_requests, output_len, length_dist, length_spread, rng)
    which = rng.integers(0, num_prefixes, num_requests)
    return [
        BenchRequest(
            [{"role": "system", "content": prefixes[k]}, {"role": "user", "content": words(n, rng)}],
            max_tokens=m,
            num_prompt_tokens=prefix_len + n,
        )
        for k, n, m in zip(which, ins, outs)
    ]
