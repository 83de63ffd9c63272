"""Fewer-step sampling for diffusion models: which sampler walks the noise schedule, in how many steps.

A model trained with T noise levels (the demo digits model: 200) is sampled in T
steps by its own DDPM scheduler. DDIM (deterministic) and DPM-Solver++ (a
second-order multistep solver) walk the same schedule in far fewer steps at about
the same quality; figures in docs/engine-optimizations.md ("Diffusion").

Tunables (live): ``diffusion.sampler`` (``default`` = the pipeline folder's own, or
ddpm | ddim | dpm) and ``diffusion.steps`` (0 = the folder's default step count).
``tokenops.toml``::

    [plugins.diffusion_sampler]
    sampler = "dpm"
    steps = 10

A request's ``sampler`` / ``num_inference_steps`` fields override both.
"""

from __future__ import annotations

from typing import Any

from tokenops import hookimpl
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "model_optimization"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"diffusion_sampler": ("sampler", "steps")}

CHOICES = ("default", "ddpm", "ddim", "dpm")


class DiffusionSampler:
    """One gateway's diffusion sampler and step count (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict[str, Any] = {"sampler": "dpm", "steps": 10}

    @hookimpl
    def tokenops_register_tunables(self, register):
        from tokenops.tune.deployment import DIFFUSION

        register(
            Tunable(
                "diffusion.sampler",
                "str",
                self.conf["sampler"],
                "Diffusion sampler: default (the model's own), ddpm, ddim or dpm (DPM-Solver++).",
                live=True,
                choices=CHOICES,
                **DIFFUSION,
            )
        )
        register(
            Tunable(
                "diffusion.steps",
                "int",
                self.conf["steps"],
                "Denoising steps per image, 0 = the model's default.",
                live=True,
                minimum=0,
                maximum=1000,
                **DIFFUSION,
            )
        )

    def _set(self, values: dict[str, Any]) -> None:
        if "sampler" in values:
            if values["sampler"] not in CHOICES:
                raise ValueError(f"[plugins.diffusion_sampler] sampler must be one of {', '.join(CHOICES)}")
            self.conf["sampler"] = values["sampler"]
        if "steps" in values:
            steps = values["steps"]
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
                raise ValueError("[plugins.diffusion_sampler] steps must be an integer >= 0")
            self.conf["steps"] = steps

    @hookimpl
    def tokenops_configure(self, settings):
        self._set(settings.plugin_settings("diffusion_sampler"))

    @hookimpl
    def tokenops_apply_tunables(self, values):
        self._set(
            {
                k.removeprefix("diffusion."): v
                for k, v in values.items()
                if k in ("diffusion.sampler", "diffusion.steps")
            }
        )

    @hookimpl
    def tokenops_diffusion_plan(self, model, plan):
        if self.conf["sampler"] != "default":
            plan.sampler = self.conf["sampler"]
        if self.conf["steps"]:
            plan.num_steps = self.conf["steps"]
