"""Sampler (diffusers scheduler) choice by name.

A pipeline folder is trained with one noise schedule (its ``scheduler/`` config);
any of these samplers can walk that schedule, with fewer steps than training used."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenops.diffusion.step_cache import StepCachePolicy

#: sampler name -> diffusers scheduler class name
SAMPLERS = {
    "ddpm": "DDPMScheduler",  # ancestral, needs about as many steps as training used
    "ddim": "DDIMScheduler",  # deterministic, good at 20-50 steps
    "dpm": "DPMSolverMultistepScheduler",  # DPM-Solver++ (2nd order multistep), good at 10-20 steps
}


class SamplerError(ValueError):
    """An unknown sampler or a step count it cannot run."""


def make_scheduler(name: str, config: Any) -> Any:
    """A fresh scheduler ``name`` for the noise schedule in ``config`` (a scheduler's ``.config``).

    Schedulers keep per-run state (timesteps, a multistep solver's history), so each
    generation needs its own."""
    import diffusers

    if name not in SAMPLERS:
        raise SamplerError(f"unknown sampler {name!r}; one of: {', '.join(SAMPLERS)}")
    cls = getattr(diffusers, SAMPLERS[name])
    return cls.from_config(config)


def check_steps(num_steps: int, num_train_timesteps: int, sampler: str | None = None) -> int:
    # DPM-Solver++ (multistep) reads one sigma past its last step: at every training
    # timestep it indexes beyond the schedule (diffusers raises IndexError), so it stops one short
    most = num_train_timesteps - 1 if sampler == "dpm" else num_train_timesteps
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or not 1 <= num_steps <= most:
        raise SamplerError(
            f"steps must be an integer in [1, {most}] (the model's training timesteps"
            f"{', less one for dpm' if most < num_train_timesteps else ''}), got {num_steps!r}"
        )
    return num_steps


@dataclass(slots=True)
class DiffusionPlan:
    """The sampler, step count and step-cache policy of one generation (adjusted by plugins
    through ``tokenops_diffusion_plan``, then by the request)."""

    sampler: str
    num_steps: int
    cache: StepCachePolicy = field(default_factory=StepCachePolicy)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampler": self.sampler,
            "steps": self.num_steps,
            "cache_threshold": self.cache.threshold,
            "cache_max_reuse": self.cache.max_reuse,
        }
