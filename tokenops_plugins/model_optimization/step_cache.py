"""Step cache for diffusion models: reuse the UNet's deep features between adjacent steps.

The mechanism (:mod:`tokenops.diffusion.step_cache`) runs the UNet's shallow path
on every step and its deep path only when the accumulated relative change of the
shallow features since the last refresh reaches ``threshold`` (TeaCache-style
change estimate, DeepCache-style reuse). This plugin sets the policy: the
threshold (0 = off), the most reuses in a row, and the warm-up steps that always
run in full. Figures per threshold in docs/engine-optimizations.md ("Diffusion").

Tunables (live): ``diffusion.cache_threshold``, ``diffusion.cache_max_reuse``.
``tokenops.toml``::

    [plugins.step_cache]
    threshold = 0.3
    max_reuse = 2
    warmup_steps = 1

A request's ``step_cache_threshold`` field overrides the threshold.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tokenops import hookimpl
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "model_optimization"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"step_cache": ("threshold", "max_reuse", "warmup_steps")}


class StepCache:
    """One gateway's diffusion step cache settings (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict[str, Any] = {"threshold": 0.0, "max_reuse": 2, "warmup_steps": 1}

    @hookimpl
    def tokenops_register_tunables(self, register):
        from tokenops.tune.deployment import DIFFUSION

        register(
            Tunable(
                "diffusion.cache_threshold",
                "float",
                self.conf["threshold"],
                "Step cache: accumulated relative "
                "change of the shallow features under which deep features are reused; 0 = off.",
                live=True,
                minimum=0.0,
                maximum=10.0,
                **DIFFUSION,
            )
        )
        register(
            Tunable(
                "diffusion.cache_max_reuse",
                "int",
                self.conf["max_reuse"],
                "Step cache: most consecutive steps that reuse the deep features.",
                live=True,
                minimum=1,
                maximum=16,
                **DIFFUSION,
            )
        )

    def _set(self, values: dict[str, Any]) -> None:
        if "threshold" in values:
            value = values["threshold"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError("[plugins.step_cache] threshold must be a number >= 0")
            self.conf["threshold"] = float(value)
        for key in ("max_reuse", "warmup_steps"):
            if key in values:
                value = values[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"[plugins.step_cache] {key} must be an integer >= 1")
                self.conf[key] = value

    @hookimpl
    def tokenops_configure(self, settings):
        self._set(settings.plugin_settings("step_cache"))

    @hookimpl
    def tokenops_apply_tunables(self, values):
        names = {"diffusion.cache_threshold": "threshold", "diffusion.cache_max_reuse": "max_reuse"}
        self._set({names[k]: v for k, v in values.items() if k in names})

    @hookimpl
    def tokenops_diffusion_plan(self, model, plan):
        plan.cache = dataclasses.replace(
            plan.cache,
            threshold=self.conf["threshold"],
            max_reuse=self.conf["max_reuse"],
            warmup_steps=self.conf["warmup_steps"],
        )
