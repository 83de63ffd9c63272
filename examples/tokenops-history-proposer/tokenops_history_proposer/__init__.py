"""Speculation from earlier sequences' tokens, plus a shortest-prompt-first queue order.

Both are registered by name (``tokenops_register_proposers`` and
``tokenops_register_schedule_orders``), which makes them selectable with
``speculative = "history"`` and ``schedule_policy = "sjf"``. The proposer implements
:class:`tokenops.engine.core.protocols.Proposer`. Its methods run on the engine thread,
once per step, so lookups stay bounded: ``max_sequences`` finished sequences, each
scanned from its end.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from tokenops import hookimpl
from tokenops.engine.core.protocols import Proposal

TOKENOPS_LAYER = "model_optimization"

_DEFAULTS: dict[str, Any] = {"min_match": 3, "max_match": 8, "max_sequences": 64}
_conf: dict[str, Any] = dict(_DEFAULTS)


def _latest_match(tokens: list[int], suffix: list[int], end: int) -> int:
    """Start of the latest occurrence of ``suffix`` in ``tokens`` that begins before ``end``;
    -1 when there is none."""
    n, first = len(suffix), suffix[0]
    i = min(end, len(tokens) - n)
    while i >= 0:
        if tokens[i] == first and tokens[i:i + n] == suffix:
            return i
        i -= 1
    return -1


class HistoryProposer:
    """Proposes the continuation of the longest suffix of the sequence (``max_match`` down to
    ``min_match`` tokens) found earlier in the sequence itself, then in the sequences seen
    before it (newest first)."""

    vocab_size = None  # proposes tokens the engine produced already

    def __init__(self, min_match: int = 3, max_match: int = 8, max_sequences: int = 64) -> None:
        if not 1 <= min_match <= max_match or max_sequences < 1:
            raise ValueError("history proposer needs 1 <= min_match <= max_match and max_sequences >= 1")
        self.min_match, self.max_match = min_match, max_match
        self._live: dict[int, list[int]] = {}  # seq_id -> that Sequence's token list (grows in place)
        self._done: deque[list[int]] = deque(maxlen=max_sequences)  # newest last

    def find(self, seq_id: int, tokens: list[int], num_tokens: int) -> list[int]:
        others = [t for i, t in self._live.items() if i != seq_id] + list(reversed(self._done))
        for n in range(min(self.max_match, len(tokens) - 1), self.min_match - 1, -1):
            suffix = tokens[-n:]
            at = _latest_match(tokens, suffix, len(tokens) - n - 1)
            if at >= 0:
                return tokens[at + n:at + n + num_tokens]
            for corpus in others:
                at = _latest_match(corpus, suffix, len(corpus) - n - 1)
                if at >= 0:
                    return corpus[at + n:at + n + num_tokens]
        return []

    # -- tokenops.engine.core.protocols.Proposer ------------------------------------------------

    def propose(self, seqs: list[Any], num_tokens: list[int]) -> list[Proposal]:
        for seq in seqs:
            self._live[seq.seq_id] = seq.token_ids
        return [Proposal(self.find(seq.seq_id, seq.token_ids, k)) for seq, k in zip(seqs, num_tokens)]

    def on_verified(self, seq: Any, num_proposed: int, num_accepted: int) -> None:
        pass  # nothing to roll back: proposals come from tokens already produced

    def release(self, seq: Any) -> None:
        tokens = self._live.pop(seq.seq_id, None)
        if tokens is not None:
            self._done.append(list(tokens))

    def retain(self, seq_ids: set[int]) -> None:
        for seq_id in [i for i in self._live if i not in seq_ids]:  # ended without a release
            self._done.append(list(self._live.pop(seq_id)))


def shortest_prompt_first(waiting: list[Any]) -> list[Any]:
    return sorted(waiting, key=lambda s: (s.num_prompt_tokens, s.arrival_time))


@hookimpl
def tokenops_configure(settings):
    conf = settings.plugin_settings("history_proposer", _DEFAULTS)
    for key, value in conf.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"[plugins.history_proposer] {key} must be an integer >= 1, not {value!r}")
    if conf["min_match"] > conf["max_match"]:
        raise ValueError("[plugins.history_proposer] min_match must be <= max_match")
    _conf.update(conf)


@hookimpl
def tokenops_register_proposers(register):
    register("history", lambda config: HistoryProposer(_conf["min_match"], _conf["max_match"], _conf["max_sequences"]))


@hookimpl
def tokenops_register_schedule_orders(register):
    register("sjf", shortest_prompt_first)
