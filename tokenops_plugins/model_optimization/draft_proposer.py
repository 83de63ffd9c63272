"""Speculative decoding with a draft model (a second, smaller model, same tokenizer).

The proposer itself is built into the engine
(:class:`tokenops.engine.spec.proposers.DraftModelProposer`, which explains how the draft's
paged cache shares the target's block tables); this plugin registers it under ``draft``
with the ``[plugins.speculative] draft_min_confidence`` setting applied.

Enable with ``EngineConfig(speculative="draft", draft_model="path/to/draft")`` or
``[plugins.speculative] method = "draft"`` plus ``draft_model`` (see
``ngram_proposer.py`` for the shared settings).
"""

from __future__ import annotations

from tokenops import hookimpl
from tokenops.engine.spec.proposers import DraftModelProposer

TOKENOPS_LAYER = "model_optimization"

__all__ = ["DraftModelProposer"]


@hookimpl
def tokenops_register_proposers(register):
    from .ngram_proposer import settings

    register(
        "draft",
        lambda config: DraftModelProposer(config, min_confidence=float(settings().get("draft_min_confidence", 0.0))),
    )
