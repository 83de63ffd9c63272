"""``DiffusionPlan``: the sampler, step count and step-cache policy of one generation.

The backend starts from the pipeline folder's defaults, lets plugins adjust it
(``tokenops_diffusion_plan``), then applies the request's own overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenops.diffusion.step_cache import StepCachePolicy


@dataclass(slots=True)
class DiffusionPlan:
    sampler: str
    num_steps: int
    cache: StepCachePolicy = field(default_factory=StepCachePolicy)

    def to_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler, "steps": self.num_steps, "cache_threshold": self.cache.threshold,
                "cache_max_reuse": self.cache.max_reuse}


def get_plan(model: str, sampler: str, num_steps: int) -> DiffusionPlan:
    """The plan for one request of ``model``: defaults, then every ``tokenops_diffusion_plan`` hook."""
    from tokenops.plugins import hook

    plan = DiffusionPlan(sampler=sampler, num_steps=num_steps)
    hook().tokenops_diffusion_plan(model=model, plan=plan)
    return plan
