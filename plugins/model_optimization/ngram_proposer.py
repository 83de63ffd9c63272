"""Speculative decoding with an n-gram (prompt lookup) proposer.

The proposer matches the last ``n`` tokens of a sequence (``n`` from
``max_ngram`` down to ``min_ngram``) against earlier positions of the same
sequence (prompt and output so far) and proposes the tokens that followed the most
recent match. It costs no model forward, so it pays off whenever outputs repeat
their context: code editing, summaries that quote, "repeat after me".

Enable per engine (``EngineConfig(speculative="ngram", num_speculative_tokens=4)``)
or in ``tokenops.toml``::

    [plugins.speculative]
    method = "ngram"        # ngram | draft
    num_tokens = 4          # most proposed tokens per step (adaptive k stays in [1, this])
    min_ngram = 1
    max_ngram = 4
    draft_model = "path/to/draft"   # method = "draft" only
    draft_min_confidence = 0.0      # draft only: stop a proposal at a token the draft gives < this probability

Tunables (restart): ``speculative.method``, ``speculative.num_tokens``.
The draft-model proposer lives in ``draft_proposer.py``; this module owns the shared
settings and applies them to the engine config (``tokenops_engine_config``).
"""

from __future__ import annotations

from typing import Any

from tokenops import hookimpl
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "model_optimization"
METHODS = ("ngram", "draft")

_conf: dict[str, Any] = {"method": None, "num_tokens": 4, "min_ngram": 1, "max_ngram": 4, "draft_model": None,
                         "draft_min_confidence": 0.0}


def settings() -> dict[str, Any]:
    """The ``[plugins.speculative]`` settings in effect (shared with the draft proposer)."""
    return dict(_conf)


class NgramProposer:
    """Prompt-lookup proposals (see the module doc); stateless, so nothing to roll back."""

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram

    def find(self, tokens: list[int], num_tokens: int) -> list[int]:
        """The up to ``num_tokens`` tokens that followed the latest earlier occurrence of
        the longest matching suffix of ``tokens`` (empty when none matches)."""
        length = len(tokens)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            suffix = tokens[length - n:]
            first = suffix[0]
            # latest start i < length - n with tokens[i:i+n] == suffix
            i = length - n - 1
            while i >= 0:
                if tokens[i] == first and tokens[i:i + n] == suffix:
                    return tokens[i + n:i + n + num_tokens]
                i -= 1
        return []

    def propose(self, seqs: list[Any], num_tokens: list[int]) -> list[Any]:
        from tokenops.engine.spec_decode import Proposal

        return [Proposal(self.find(seq.token_ids, k)) for seq, k in zip(seqs, num_tokens)]

    def on_verified(self, seq: Any, num_proposed: int, num_accepted: int) -> None:
        pass

    def release(self, seq: Any) -> None:
        pass


@hookimpl
def tokenops_register_tunables(register):
    register(Tunable("speculative.method", "str", "off", "Speculative decoding proposer (restart).",
                     choices=("off", *METHODS), searchable=False))
    register(Tunable("speculative.num_tokens", "int", 4, "Most proposed tokens per decode step (restart).",
                     minimum=1, maximum=8, searchable=False))


@hookimpl
def tokenops_configure(settings):
    conf = settings.plugin_settings("speculative")
    method = conf.get("method")
    if method not in (None, "off", *METHODS):
        raise ValueError(f"[plugins.speculative] method must be one of {METHODS} or 'off', not {method!r}")
    for key in ("num_tokens", "min_ngram", "max_ngram"):
        value = conf.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"[plugins.speculative] {key} must be an integer >= 1, not {value!r}")
    if conf.get("min_ngram", _conf["min_ngram"]) > conf.get("max_ngram", _conf["max_ngram"]):
        raise ValueError("[plugins.speculative] min_ngram must be <= max_ngram")
    if method == "draft" and not (conf.get("draft_model") or _conf["draft_model"]):
        raise ValueError("[plugins.speculative] method = 'draft' needs draft_model (a local model folder)")
    confidence = conf.get("draft_min_confidence", 0.0)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence < 1:
        raise ValueError("[plugins.speculative] draft_min_confidence must be a number in [0, 1)")
    _conf.update({k: conf[k] for k in ("num_tokens", "min_ngram", "max_ngram", "draft_model", "draft_min_confidence")
                  if k in conf})
    _conf["method"] = None if method in (None, "off") else method


@hookimpl
def tokenops_engine_config(config):
    """Apply ``[plugins.speculative]`` to an engine whose config leaves speculation unset."""
    if _conf["method"] is None or getattr(config, "speculative", None) is not None:
        return
    config.speculative = _conf["method"]
    config.num_speculative_tokens = int(_conf["num_tokens"])
    if _conf["draft_model"] and not config.draft_model:
        config.draft_model = _conf["draft_model"]


@hookimpl
def tokenops_draft_proposer(config):
    if getattr(config, "speculative", None) != "ngram":
        return None
    return NgramProposer(int(_conf["min_ngram"]), int(_conf["max_ngram"]))
