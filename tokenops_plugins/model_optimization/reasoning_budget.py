"""Reasoning budget policy: how long a reasoning model may think, per request.

The engine enforces a budget by budget forcing (:mod:`tokenops.engine.sampling.thinking`); this
plugin decides it (``tokenops_reasoning_budget``), in this order:

1. ``max_thinking_tokens`` in the request (extension): that many tokens;
2. ``reasoning_effort``: ``none``/``minimal`` -> 0, ``low``/``medium``/``high`` -> the
   ``reasoning.budget_*`` tunables (a negative value means unlimited);
3. with ``reasoning.adaptive`` on: the difficulty-adaptive budget of the table in
   ``profiles/reasoning/<model>.json`` (re-read when the file changes), learned by a
   calibration run (:mod:`tokenops_plugins.model_optimization._adaptive_budget`) or from
   recorded traffic (``tokenops reasoning learn``,
   :mod:`tokenops_plugins.model_optimization._traffic_budget`): the prompt's predicted
   dimension (the profile router's classifier) and its length pick a budget;
4. otherwise unlimited.

``reasoning.suppress_reflection`` masks the tokens of ``reflection_words`` ("Wait",
"Hmm") while the model thinks (NoWait-style). Off by default: without a request field,
adaptive mode or suppression nothing changes. With ``record_features`` (on) the prompt's
features go to the request's ``decisions`` (telemetry only), so the traffic can be learned.

```toml
[plugins.reasoning_budget]
low = 16
medium = 48
high = -1                  # unlimited
adaptive = false
adaptive_table = "profiles/reasoning/reasoning-small.json"   # default: profiles/reasoning/<model>.json
suppress_reflection = false
reflection_words = ["Wait", "Hmm"]
record_features = true     # note (dimension, words) per request in requests.decisions
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenops import hookimpl
from tokenops.tunables import Tunable
from tokenops.types import ReasoningBudget

TOKENOPS_LAYER = "model_optimization"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {
    "reasoning_budget": (
        "low",
        "medium",
        "high",
        "adaptive",
        "suppress_reflection",
        "record_features",
        "reflection_words",
        "adaptive_table",
    )
}

DEFAULTS: dict[str, Any] = {
    "low": 16,
    "medium": 48,
    "high": -1,
    "adaptive": False,
    "adaptive_table": None,
    "suppress_reflection": False,
    "reflection_words": ("Wait", "Hmm"),
    "record_features": True,
}
_TUNABLE_KEYS = {
    "reasoning.budget_low": "low",
    "reasoning.budget_medium": "medium",
    "reasoning.budget_high": "high",
    "reasoning.adaptive": "adaptive",
    "reasoning.suppress_reflection": "suppress_reflection",
}


def _limit(value: int) -> int | None:
    return None if value < 0 else value


class ReasoningBudgetPolicy:
    """One gateway's reasoning budget policy and its options (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict[str, Any] = dict(DEFAULTS)

    @hookimpl
    def tokenops_register_decisions(self, register):
        register("reasoning_features", dict[str, Any])  # what the adaptive budget policy saw

    @hookimpl
    def tokenops_register_tunables(self, register):
        for effort in ("low", "medium", "high"):
            register(
                Tunable(
                    f"reasoning.budget_{effort}",
                    "int",
                    DEFAULTS[effort],
                    f"Thinking tokens a request with reasoning_effort={effort} may spend before the engine "
                    "closes the thinking block; -1 = unlimited.",
                    live=True,
                    minimum=-1,
                    maximum=1 << 20,
                    searchable=False,
                )
            )
        register(
            Tunable(
                "reasoning.adaptive",
                "bool",
                False,
                "Requests that name no budget get the difficulty-"
                "adaptive budget learned by a calibration run (profiles/reasoning/<model>.json).",
                live=True,
                searchable=False,
            )
        )
        register(
            Tunable(
                "reasoning.suppress_reflection",
                "bool",
                False,
                "Mask reflection words (reasoning reflection_words, default Wait/Hmm) while a reasoning model thinks.",
                live=True,
                searchable=False,
            )
        )

    def _set(self, values: dict[str, Any]) -> None:
        for key in ("low", "medium", "high"):
            if key in values:
                v = values[key]
                if isinstance(v, bool) or not isinstance(v, int) or v < -1:
                    raise ValueError(f"[plugins.reasoning_budget] {key} must be an integer >= -1 (-1 = unlimited)")
                self.conf[key] = v
        for key in ("adaptive", "suppress_reflection", "record_features"):
            if key in values:
                if not isinstance(values[key], bool):
                    raise ValueError(f"[plugins.reasoning_budget] {key} must be true or false")
                self.conf[key] = values[key]
        if "reflection_words" in values:
            words = values["reflection_words"]
            if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) and w.strip() for w in words):
                raise ValueError("[plugins.reasoning_budget] reflection_words must be a list of words")
            self.conf["reflection_words"] = tuple(w.strip() for w in words)
        if "adaptive_table" in values:
            self.conf["adaptive_table"] = values["adaptive_table"]

    def configure(self, **values: Any) -> None:
        """Set options in-process (tests, benchmarks); ``reset()`` restores the defaults."""
        self._set(values)

    def reset(self) -> None:
        self.conf.clear()
        self.conf.update(DEFAULTS)

    @hookimpl
    def tokenops_configure(self, settings):
        self.reset()
        self._set(dict(settings.plugin_settings("reasoning_budget")))

    @hookimpl
    def tokenops_apply_tunables(self, values):
        self._set({_TUNABLE_KEYS[k]: v for k, v in values.items() if k in _TUNABLE_KEYS})

    @hookimpl
    def tokenops_register_commands(self, app):
        from ._reasoning_cli import reasoning_app

        app.add_typer(reasoning_app, name="reasoning")

    @hookimpl(trylast=True)
    def tokenops_reasoning_budget(self, request, model):
        fields = request.output
        feats = None
        if self.conf["record_features"] or self.conf["adaptive"]:
            from ._adaptive_budget import features

            feats = features(request.prompt_text())
            if self.conf["record_features"]:
                request.decide("reasoning_features", {"dimension": feats[0], "words": feats[1]})
        suppress = tuple(self.conf["reflection_words"]) if self.conf["suppress_reflection"] else ()
        if fields.max_thinking_tokens is not None:
            limit = fields.max_thinking_tokens
            return ReasoningBudget(limit, suppress, f"max_thinking_tokens={limit}")
        effort = fields.reasoning_effort
        if effort is not None:
            limit = 0 if effort in ("none", "minimal") else _limit(self.conf[effort])
            return ReasoningBudget(limit, suppress, f"reasoning_effort={effort}")
        if self.conf["adaptive"]:
            from ._adaptive_budget import load_table

            table = load_table(Path(self.conf["adaptive_table"] or f"profiles/reasoning/{model}.json"))
            if table is not None:
                limit, why = table.budget_for(request.prompt_text(), feats)
                return ReasoningBudget(limit, suppress, f"adaptive: {why}")
        return ReasoningBudget(None, suppress, "unlimited") if suppress else None
