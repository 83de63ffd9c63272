"""The plugins' side of a diffusion generation's plan (:class:`DiffusionPlan`, in
:mod:`tokenops.diffusion.samplers`): the backend starts from the pipeline folder's defaults,
lets plugins adjust it (``tokenops_diffusion_plan``, asked here: this module sits on the
plugin-manager floor and is passed to the backend by the plugin that builds it, see
:mod:`tokenops.backends.plugin_calls`), then applies the request's own overrides."""

from __future__ import annotations

from tokenops.diffusion.samplers import DiffusionPlan

__all__ = ["DiffusionPlan", "get_plan"]


def get_plan(model: str, sampler: str, num_steps: int) -> DiffusionPlan:
    """The plan for one request of ``model``: defaults, then every ``tokenops_diffusion_plan`` hook."""
    from tokenops.plugin_manager import hook

    plan = DiffusionPlan(sampler=sampler, num_steps=num_steps)
    hook().tokenops_diffusion_plan(model=model, plan=plan)
    return plan
