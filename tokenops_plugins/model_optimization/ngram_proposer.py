"""Speculative decoding settings and the n-gram (prompt lookup) proposer with them.

The proposer (:class:`tokenops.engine.spec.proposers.NgramProposer`, built into the engine)
matches the last ``n`` tokens of a sequence (``n`` from ``max_ngram`` down to
``min_ngram``) against earlier positions of the same sequence and proposes the tokens
that followed the most recent match. It costs no model forward, so it pays off whenever
outputs repeat their context: code editing, summaries that quote, "repeat after me".
This plugin registers it under ``ngram`` with the n-gram sizes below.

Enable per engine (``EngineConfig(speculative="ngram", num_speculative_tokens=4)``)
or in ``tokenops.toml``::

    [plugins.speculative]
    method = "ngram"        # ngram | suffix | draft | a name a plugin registers (tokenops_register_proposers)
    num_tokens = 4          # most proposed tokens per step (adaptive k stays in [1, this])
    min_ngram = 2           # ngram: 2 (1 also proposes after a lone matching token, rarely accepted); suffix: 1
    max_ngram = 4           # ngram: 4; suffix: 8 (its acceptance tables cut what a short match proposes)
    corpus = "path/to/answers.u16"  # method = "suffix" only: unset = the default model's shipped corpus, "none" = none
    verify_costs = [1.14, 1.15, 1.2, 1.34, 1.45, 1.62, 1.67, 2.02]  # suffix only: a step verifying 1, 2, ... tokens, in decode steps
    draft_model = "path/to/draft"   # method = "draft" only
    draft_min_confidence = 0.0      # draft only: stop a proposal at a token the draft gives < this probability
    disable_by_batch_size = 0       # no proposals while this many sequences or more run (0: never)

Tunables (restart): ``speculative.method``, ``speculative.num_tokens``.
``suffix`` (:mod:`tokenops.engine.spec.suffix_proposer`) is prompt lookup first and, where it finds
nothing, the most frequent continuation in a corpus of the model's own answers: the one that pays
on chat, where little of the answer is in the prompt. Its corpus must be built with the model's
tokenizer (checked when the engine is built). ``verify_costs`` tells it what verifying costs on
your machine (``tests/benchmarks/speculative.py --verify-cost`` prints the column); unset, it uses
the table measured with the AMX tiles where the model's GGUF runs on them, else a row at a quarter
of a decode step (:func:`tokenops.engine.spec.suffix_proposer.default_verify_costs`).
The draft-model proposer is registered by ``draft_proposer.py``; this module owns the
shared settings and applies them to the engine config (``tokenops_engine_config``). The
method name is checked against the registered proposers when the engine is built.
"""

from __future__ import annotations

from typing import Any

from tokenops import hookimpl
from tokenops.engine.spec.proposers import NgramProposer
from tokenops.engine.spec.suffix_proposer import build_suffix_proposer, check_verify_costs
from tokenops.tunables import Tunable

__all__ = ["NgramProposer", "settings"]

TOKENOPS_LAYER = "model_optimization"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {
    "speculative": (
        "method",
        "num_tokens",
        "min_ngram",
        "max_ngram",
        "corpus",
        "verify_costs",
        "draft_model",
        "draft_min_confidence",
        "disable_by_batch_size",
    )
}
METHODS = ("ngram", "suffix", "draft")

#: ngram's min_ngram 2 (the engine's bare proposer keeps 1): a verify row costs a quarter to a half of a decode
#: step on the quantized default model, and tokens that followed a lone matching token were accepted
#: 16-29% of the time there, too rarely to pay for it (tests/benchmarks/speculative_replay.py;
#: docs/engine-optimizations.md, "On the real default model").
NGRAM_SIZES = (2, 4)


def settings() -> dict[str, Any]:
    """The ``[plugins.speculative]`` settings of the running gateway (the process's outside one),
    shared with the draft proposer; empty when this plugin is not loaded."""
    from tokenops.plugin_manager import get_plugin

    plugin = get_plugin("ngram_proposer")
    return plugin.settings() if isinstance(plugin, NgramSettings) else {}


class NgramSettings:
    """One gateway's ``[plugins.speculative]``: its proposer and sizes (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict[str, Any] = {
            "method": None,
            "num_tokens": 4,
            "min_ngram": None,  # None: the method's default (NGRAM_SIZES, or the suffix proposer's own)
            "max_ngram": None,
            "corpus": None,
            "verify_costs": None,  # None: suffix_proposer.default_verify_costs for the engine's model
            "draft_model": None,
            "draft_min_confidence": 0.0,
            "disable_by_batch_size": 0,
        }

    def settings(self) -> dict[str, Any]:
        """This gateway's ``[plugins.speculative]`` settings (shared with the draft proposer)."""
        return dict(self.conf)

    @hookimpl
    def tokenops_register_tunables(self, register):
        register(
            Tunable(
                "speculative.method",
                "str",
                "off",
                f"Speculative decoding proposer: off, {', '.join(METHODS)} or one a plugin registers (restart).",
                searchable=False,
            )
        )
        register(
            Tunable(
                "speculative.num_tokens",
                "int",
                4,
                "Most proposed tokens per decode step (restart).",
                minimum=1,
                maximum=8,
                searchable=False,
            )
        )

    @hookimpl
    def tokenops_configure(self, settings):
        conf = settings.plugin_settings("speculative")
        method = conf.get("method")
        if method is not None and (not isinstance(method, str) or not method):
            raise ValueError(
                f"[plugins.speculative] method must be 'off' or a proposer name such as "
                f"{' or '.join(METHODS)}, not {method!r}"
            )
        for key in ("num_tokens", "min_ngram", "max_ngram"):
            value = conf.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"[plugins.speculative] {key} must be an integer >= 1, not {value!r}")
        low, high = conf.get("min_ngram", self.conf["min_ngram"]), conf.get("max_ngram", self.conf["max_ngram"])
        if low is not None and high is not None and low > high:
            raise ValueError("[plugins.speculative] min_ngram must be <= max_ngram")
        if method == "draft" and not (conf.get("draft_model") or self.conf["draft_model"]):
            raise ValueError("[plugins.speculative] method = 'draft' needs draft_model (a local model folder)")
        disable = conf.get("disable_by_batch_size", 0)
        if isinstance(disable, bool) or not isinstance(disable, int) or disable < 0:
            raise ValueError(
                f"[plugins.speculative] disable_by_batch_size must be an integer >= 0 (0: never), not {disable!r}"
            )
        corpus = conf.get("corpus")
        if corpus is not None and (not isinstance(corpus, str) or not corpus):
            raise ValueError(f"[plugins.speculative] corpus must be a file path or 'none', not {corpus!r}")
        if conf.get("verify_costs") is not None:
            try:
                check_verify_costs(conf["verify_costs"])
            except ValueError as e:
                raise ValueError(f"[plugins.speculative] {e}") from None
        confidence = conf.get("draft_min_confidence", 0.0)
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence < 1:
            raise ValueError("[plugins.speculative] draft_min_confidence must be a number in [0, 1)")
        self.conf.update(
            {
                k: conf[k]
                for k in (
                    "num_tokens",
                    "min_ngram",
                    "max_ngram",
                    "corpus",
                    "verify_costs",
                    "draft_model",
                    "draft_min_confidence",
                    "disable_by_batch_size",
                )
                if k in conf
            }
        )
        self.conf["method"] = None if method in (None, "off") else method

    @hookimpl
    def tokenops_engine_config(self, config):
        """Apply ``[plugins.speculative]`` to an engine whose config leaves speculation unset."""
        if self.conf["method"] is None or getattr(config, "speculative", None) is not None:
            return
        config.speculative = self.conf["method"]
        config.num_speculative_tokens = int(self.conf["num_tokens"])
        config.speculative_disable_by_batch_size = int(self.conf["disable_by_batch_size"])
        if self.conf["draft_model"] and not config.draft_model:
            config.draft_model = self.conf["draft_model"]

    @hookimpl
    def tokenops_tunable_values(self, config):
        """What runs: the engine's proposer (from this table or the model's own ``engine = {...}``)."""
        return {
            "speculative.method": config.speculative or "off",
            "speculative.num_tokens": config.num_speculative_tokens,
        }

    @hookimpl
    def tokenops_register_proposers(self, register):
        register("ngram", lambda config: NgramProposer(*self.ngram_sizes()))
        register(
            "suffix",
            lambda config: build_suffix_proposer(
                config, self.conf["corpus"], self.conf["min_ngram"], self.conf["max_ngram"], self.conf["verify_costs"]
            ),
        )

    def ngram_sizes(self) -> tuple[int, int]:
        """The ``ngram`` proposer's match sizes: the settings, else :data:`NGRAM_SIZES`."""
        low, high = self.conf["min_ngram"], self.conf["max_ngram"]
        if low is None:
            low = NGRAM_SIZES[0] if high is None else min(NGRAM_SIZES[0], high)
        if high is None:
            high = max(NGRAM_SIZES[1], low)
        return int(low), int(high)
