"""The ``suffix`` proposer: prompt lookup and the model's own past answers, whichever pays.

Prompt lookup (:class:`~tokenops.engine.spec.proposers.NgramProposer`) finds little to copy in most chat
turns: the answer is new text. But a small instruct model writes the same phrases across answers
("Sure! Here", "I hope this helps", list and code scaffolding), so a corpus of its own answers to
other prompts (``scripts/build_spec_corpus.py``) predicts many of its next tokens. Each step this
proposer has two candidates: the prompt-lookup match (matches of 1-8 tokens), and the most frequent
continuation of the sequence's longest suffix found in the corpus, walked in a suffix array
(:class:`~tokenops.engine.spec.suffix_index.SuffixIndex`; SuffixDecoding, Oliaro et al. 2024, walks a
suffix tree over past outputs the same way).

Which candidate, and how much of it, follows from what verifying costs. On the quantized default
model a verify row costs about a fifth of a decode step (``tests/benchmarks/speculative.py
--verify-cost``) and a verify round a tenth or more on top, so a proposed token must be likely to
be accepted to pay: verifying j tokens costs ``round_cost + cost(j)`` steps (``cost(j) = 1 +
row_cost * j``, or a measured table: with the AMX tiles a step of 4-8 rows costs little more than
one of 3) and yields ``1 + p1 + p1 p2 + ...`` tokens on average, ``p`` each token's chance of
acceptance once those before it are accepted. Those chances come from acceptance tables
(:class:`AcceptanceTables`) measured on the corpus' own prompts: by match length and position for
prompt lookup, by the token's share of the corpus occurrences and the matched context length for
the corpus. The proposer keeps the candidate and cut with the best expected tokens per cost, and
proposes nothing when no cut beats a plain decode step.

Deterministic (no ``probs``): for sampled requests the target accepts a token with its own
probability, as for prompt lookup. It remembers only which source each proposal under verification
came from, for its ``stats()`` (proposals and accepted tokens per source, in the engine's
``spec_decode.proposer``); the index is read-only and shared by the engines of a process.

The corpus is two files: ``NAME.u16`` (uint16 token ids, each answer ended by a stop token) and
``NAME.json`` (``vocab_size`` and ``tokenizer_sha256``, a digest of the tokenizer's vocabulary,
checked against the target's so a corpus of another tokenizer is refused instead of proposing
nonsense, and the ``acceptance`` tables). The default model's corpus ships in
``tokenops/demo_models/smollm2-answers``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import abc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenops.engine.core.protocols import Proposal
from tokenops.engine.spec.proposers import NgramProposer
from tokenops.engine.spec.suffix_index import Continuation, MatchHint, SuffixIndex

if TYPE_CHECKING:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.sequence import Sequence
    from tokenops.engine.core.tokenizer import Tokenizer

log = logging.getLogger(__name__)

#: The default model's corpus (its greedy answers to 640 ShareGPT prompts outside the benchmarks' split).
DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "demo_models" / "smollm2-answers" / "answers.u16"


def tokenizer_digest(tokenizer: Tokenizer, vocab_size: int) -> str:
    """sha256 of the token strings of ids 0..vocab_size-1: equal for the same vocabulary."""
    digest = hashlib.sha256()
    for token_id in range(vocab_size):
        digest.update((tokenizer.id_to_token(token_id) or "").encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


def corpus_meta_path(corpus: Path) -> Path:
    return corpus.with_suffix(".json")


def corpus_meta(tokenizer: Tokenizer) -> dict[str, object]:
    """What a corpus file's JSON records about the tokenizer it was built with."""
    return {"vocab_size": tokenizer.vocab_size, "tokenizer_sha256": tokenizer_digest(tokenizer, tokenizer.vocab_size)}


def load_corpus_meta(corpus: Path, expected: dict[str, object]) -> dict[str, object]:
    """The corpus' JSON, after checking it was built with the tokenizer ``expected`` describes
    (:func:`corpus_meta`; ValueError if not)."""
    meta_path = corpus_meta_path(corpus)
    if not corpus.is_file() or not meta_path.is_file():
        raise ValueError(f"speculative corpus {corpus} needs the token file and {meta_path.name} beside it")
    meta = json.loads(meta_path.read_text())
    if any(meta.get(key) != value for key, value in expected.items()):
        raise ValueError(
            f"speculative corpus {corpus} was built with another tokenizer (vocab {meta.get('vocab_size')}, "
            f"the model's {expected['vocab_size']}): rebuild it with scripts/build_spec_corpus.py"
        )
    return meta


_TOKENIZER_META: dict[tuple[str, int], dict[str, object]] = {}


def model_tokenizer_meta(model_dir: Path) -> dict[str, object]:
    """:func:`corpus_meta` of a model's tokenizer, once per model file or folder and process (loading a
    GGUF's tokenizer takes seconds; the engines of a replicated model share the result)."""
    from tokenops.engine.models.loader import load_tokenizer

    key = (str(model_dir.resolve()), model_dir.stat().st_mtime_ns)
    if key not in _TOKENIZER_META:
        _TOKENIZER_META[key] = corpus_meta(load_tokenizer(model_dir))
    return _TOKENIZER_META[key]


#: Buckets of the acceptance tables: a prompt-lookup match of 1..OWN_MAX_MATCH tokens (longer ones
#: count as the longest), the first OWN_POSITIONS proposed tokens (later ones as the last); a corpus
#: token's smoothed share in tenths, its walk's matched context as <2, 2-3, 4-7 and >= 8 tokens.
OWN_MAX_MATCH = 6
OWN_POSITIONS = 8
SHARE_BUCKETS = 10
MATCH_BUCKETS = (2, 4, 8)
CORPUS_POSITIONS = 3  # the walk's first, second, and later tokens


def match_bucket(match_len: int) -> int:
    return sum(match_len >= edge for edge in MATCH_BUCKETS)


def share_bucket(share: float) -> int:
    return min(int(share * SHARE_BUCKETS), SHARE_BUCKETS - 1)


@dataclass(frozen=True, slots=True)
class AcceptanceTables:
    """How often the target accepted a proposed token, given that it accepted the ones before it:
    ``own[n - 1][j]`` for the j-th token of a prompt-lookup match of n tokens, ``corpus[b][m][j]`` for
    the j-th token of a corpus walk, of share bucket b, after a context match of bucket m. Measured on the corpus' own
    prompts, cross-fitted (:mod:`tokenops.engine.spec.suffix_calibration`), stored in the corpus' JSON."""

    own: list[list[float]]
    corpus: list[list[list[float]]]

    def own_probs(self, match_len: int, num_tokens: int) -> list[float]:
        row = self.own[min(match_len, len(self.own)) - 1]
        return [row[min(j, len(row) - 1)] for j in range(num_tokens)]

    def corpus_probs(self, walk: Continuation) -> list[float]:
        m = match_bucket(walk.match_len)
        last = CORPUS_POSITIONS - 1
        return [self.corpus[share_bucket(p)][m][min(j, last)] for j, p in enumerate(walk.smoothed(1.0))]

    def to_json(self) -> dict[str, Any]:
        return {"own": self.own, "corpus": self.corpus}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AcceptanceTables:
        own, corpus = data["own"], data["corpus"]
        if len(own) != OWN_MAX_MATCH or any(len(r) != OWN_POSITIONS for r in own):
            raise ValueError(f"acceptance table 'own' must be {OWN_MAX_MATCH} x {OWN_POSITIONS}")
        shape = (SHARE_BUCKETS, len(MATCH_BUCKETS) + 1, CORPUS_POSITIONS)
        if np.shape(corpus) != shape:
            raise ValueError(f"acceptance table 'corpus' must be {' x '.join(map(str, shape))}")
        return cls(own, corpus)


#: A verify row's cost in decode steps on the quantized default model: 0.20 measured at one thread
#: (``speculative.py --verify-cost``), and a verify round 0.1-0.2 more than a plain step whatever its
#: rows (rejection, KV roll-back, more tokens through the output processor: the engine's step CPU time
#: against the forward's). These two gave the best replayed cuts (``speculative_replay.py``).
DEFAULT_ROW_COST = 0.25
DEFAULT_ROUND_COST = 0.1
#: What one step verifying j = 1..8 proposals costs in plain decode steps (before the round cost) where
#: the quantized matrices run on the AMX tiles from 3 rows (``csrc/quant_amx.c``), by torch threads (2 for
#: more): the default model's Q4_1 GGUF on Sapphire Rapids (``speculative.py --verify-cost --threads
#: N``, thirteenth session). Not linear: 4-8 rows cost ~0.1 step a row more, a 9th row a second pass
#: over the weights. 2 threads: the mean of three runs (1.14, 1.15, 1.20, ...) + 0.05, since a round's
#: Python is a larger share of the faster step there (+0.05 gave 1.32-1.34x on 24 chat prompts against
#: 1.29-1.31x in paired runs; -0.05 1.28x; at one thread +-0.05 both lost).
AMX_VERIFY_COSTS = {
    1: (1.13, 1.29, 1.39, 1.47, 1.59, 1.69, 1.77, 2.17),
    2: (1.19, 1.20, 1.25, 1.39, 1.50, 1.67, 1.72, 2.07),
}
SOURCES = ("prompt", "corpus")


def linear_verify_costs(row_cost: float = DEFAULT_ROW_COST, num: int = 16) -> tuple[float, ...]:
    """``1 + row_cost * j`` for j = 1..num: a verify row costing the same whatever the rows beside it."""
    return tuple(1.0 + row_cost * j for j in range(1, num + 1))


def default_verify_costs(config: EngineConfig) -> tuple[float, ...]:
    """:data:`AMX_VERIFY_COSTS` for the engine's torch threads where ``config``'s model is a GGUF file
    run on the CPU by the quantized kernels with their AMX tiles on; elsewhere a row at
    :data:`DEFAULT_ROW_COST`."""
    import torch

    from tokenops.engine.gguf.gguf_reader import is_gguf
    from tokenops.engine.kernels import quant_kernels
    from tokenops.engine.models.loader import resolve_model_dir

    if config.device not in ("cpu", "auto") or (config.device == "auto" and torch.cuda.is_available()):
        return linear_verify_costs()
    try:
        path = resolve_model_dir(config.model, config.allow_download)  # None: the embedded default model
    except Exception:  # noqa: BLE001 - the engine build reports a model it cannot find; the cost is a guess
        return linear_verify_costs()
    kernels = quant_kernels.get_kernels()
    if kernels is None or not kernels.amx_active or not path.is_file() or not is_gguf(path):
        return linear_verify_costs()
    threads = config.torch_threads or torch.get_num_threads()
    return AMX_VERIFY_COSTS[1 if threads == 1 else 2]


def check_verify_costs(costs: object) -> tuple[float, ...]:
    """``costs`` as a tuple, after checking it is a non-empty list of numbers >= 1 that never
    decreases (ValueError with what is wrong)."""
    if (
        not isinstance(costs, (list, tuple))
        or not costs
        or any(isinstance(c, bool) or not isinstance(c, (int, float)) or c < 1 for c in costs)
    ):
        raise ValueError(f"verify_costs must be a non-empty list of numbers >= 1 (decode steps), not {costs!r}")
    if any(b < a for a, b in zip(costs, costs[1:])):
        raise ValueError(f"verify_costs must not decrease: verifying more tokens never costs less ({list(costs)})")
    return tuple(float(c) for c in costs)


def best_cut(probs: list[float], costs: float | abc.Sequence[float], round_cost: float = 0.0) -> tuple[int, float]:
    """How many of a proposal's tokens to verify, and the expected tokens per decode-step cost that
    gives: token j is accepted with ``probs[j]`` once those before it are; verifying j tokens costs
    ``round_cost + costs[j - 1]`` steps (``costs`` a number: ``1 + costs * j``, a row's cost; a
    table: no cut past its end) and yields ``1 + p1 + p1 p2 + ...`` tokens on average."""
    table = linear_verify_costs(costs, len(probs)) if isinstance(costs, (int, float)) else costs
    best_len, best_ratio, joint, expected = 0, 1.0, 1.0, 1.0
    for length, prob in enumerate(probs[: len(table)], 1):
        joint *= prob
        expected += joint
        ratio = expected / (round_cost + table[length - 1])
        if ratio > best_ratio:
            best_len, best_ratio = length, ratio
    return best_len, best_ratio


class SuffixProposer:
    """Prompt lookup and the corpus' most frequent continuation, whichever the acceptance tables
    expect to pay more, cut where it pays most (module doc). Without a corpus: prompt lookup as the
    ``ngram`` proposer does it."""

    vocab_size: int | None = None  # proposes ids of the sequence or the corpus (checked at load)

    def __init__(
        self,
        index: SuffixIndex | None,
        tables: AcceptanceTables | None,
        min_ngram: int = 1,
        max_ngram: int = 8,
        row_cost: float = DEFAULT_ROW_COST,
        round_cost: float = DEFAULT_ROUND_COST,
        max_match: int = 16,
        verify_costs: abc.Sequence[float] | None = None,
    ) -> None:
        if (index is None) != (tables is None):
            raise ValueError("a corpus index needs its acceptance tables (and tables a corpus)")
        self.lookup = NgramProposer(min_ngram, max_ngram)
        self.index = index
        self.tables = tables
        #: what verifying j = 1.. tokens costs in decode steps (best_cut); row_cost's line without a table
        self.verify_costs = tuple(verify_costs) if verify_costs is not None else linear_verify_costs(row_cost)
        self.round_cost = round_cost
        self.max_match = max_match
        #: per source ("prompt", "corpus"): proposals, proposed tokens, accepted tokens
        self.counts = {source: [0, 0, 0] for source in SOURCES}
        self._source: dict[int, str] = {}  # seq_id -> the source of its proposal under verification
        #: seq_id -> its last corpus match, which the next step's walk starts from (the same walk, faster)
        self._hints: dict[int, MatchHint] = {}

    def find(self, tokens: list[int], num_tokens: int, seq_id: int | None = None) -> tuple[list[int], str]:
        """The proposal for a sequence of ``tokens`` and its source (``prompt`` or ``corpus``);
        ``seq_id`` keeps the sequence's corpus match for its next call."""
        own, match_len = self.lookup.lookup(tokens, num_tokens)
        if self.index is None or self.tables is None:
            return own, "prompt"
        best, best_ratio, source = [], 1.0, "prompt"
        if own:
            cut, best_ratio = best_cut(self.tables.own_probs(match_len, len(own)), self.verify_costs, self.round_cost)
            best = own[:cut]
        hint = self._hints.get(seq_id) if seq_id is not None else None
        walk = self.index.continuation(tokens, num_tokens, max_match=self.max_match, min_count=1, hint=hint)
        if seq_id is not None:
            if walk.hint is None:
                self._hints.pop(seq_id, None)
            else:
                self._hints[seq_id] = walk.hint
        if walk.tokens:
            cut, ratio = best_cut(self.tables.corpus_probs(walk), self.verify_costs, self.round_cost)
            if ratio > best_ratio:
                best, source = walk.tokens[:cut], "corpus"
        return best, source

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Proposal]:
        proposals = []
        for seq, k in zip(seqs, num_tokens):
            tokens, source = self.find(seq.token_ids, k, seq.seq_id)
            if tokens:
                self._source[seq.seq_id] = source
                self.counts[source][0] += 1
                self.counts[source][1] += len(tokens)
            proposals.append(Proposal(tokens))
        return proposals

    def on_verified(self, seq: Sequence, num_proposed: int, num_accepted: int) -> None:
        source = self._source.pop(seq.seq_id, None)
        if source is not None:
            self.counts[source][2] += num_accepted

    def release(self, seq: Sequence) -> None:
        self._source.pop(seq.seq_id, None)
        self._hints.pop(seq.seq_id, None)

    def retain(self, seq_ids: set[int]) -> None:
        self._source = {i: s for i, s in self._source.items() if i in seq_ids}
        self._hints = {i: h for i, h in self._hints.items() if i in seq_ids}

    def stats(self) -> dict[str, dict[str, int]]:
        """Per source: ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``."""
        names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
        return {source: dict(zip(names, counts)) for source, counts in self.counts.items()}


_INDEXES: dict[tuple[str, int], SuffixIndex] = {}  # built once per corpus file: engines share them


def _index(corpus: Path, vocab_size: int) -> SuffixIndex:
    key = (str(corpus.resolve()), corpus.stat().st_mtime_ns)
    if key not in _INDEXES:
        _INDEXES[key] = SuffixIndex(np.fromfile(corpus, dtype=np.uint16), vocab_size)
    return _INDEXES[key]


def build_suffix_proposer(
    config: EngineConfig,
    corpus: str | None = None,
    min_ngram: int | None = None,
    max_ngram: int | None = None,
    verify_costs: abc.Sequence[float] | None = None,
) -> SuffixProposer:
    """The proposer for ``config``'s model. ``corpus``: a corpus file (refused with a ValueError when
    it is missing, has no acceptance tables or was built with another tokenizer), ``"none"`` for
    prompt lookup alone, or None for the shipped corpus of the default model when the model has its
    tokenizer (else prompt lookup alone, logged). The lookup's match sizes default to 1..8 (the
    tables cut what a short match proposes). ``verify_costs``: what a step verifying j = 1.. tokens
    costs in decode steps (default: :func:`default_verify_costs`)."""
    from tokenops.engine.models.loader import resolve_model_dir

    sizes = (min_ngram or 1, max_ngram or 8)
    costs = check_verify_costs(verify_costs) if verify_costs is not None else default_verify_costs(config)
    if corpus == "none":
        return SuffixProposer(None, None, *sizes, verify_costs=costs)
    path = Path(corpus).expanduser() if corpus else DEFAULT_CORPUS
    try:
        meta = load_corpus_meta(path, model_tokenizer_meta(resolve_model_dir(config.model, config.allow_download)))
        tables = AcceptanceTables.from_json(meta["acceptance"])  # type: ignore[arg-type]
    except (ValueError, KeyError) as e:
        if corpus:
            raise ValueError(f"speculative corpus {path}: {e}") from None
        log.warning("speculative = 'suffix': %s; proposing from prompt lookup alone", e)
        return SuffixProposer(None, None, *sizes, verify_costs=costs)
    index = _index(path, int(meta["vocab_size"]))  # type: ignore[call-overload]
    return SuffixProposer(index, tables, *sizes, verify_costs=costs)
