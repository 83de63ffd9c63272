"""What a backend asks the plugins, passed in by whoever builds it.

The backends sit below the plugin manager: they never call it. The plugin that registers a
backend kind (``tokenops_plugins.default_backends``) builds each backend with
:func:`tokenops.policy_hooks.plugin_calls`, which answers from the hooks; a backend built
without it (a test, a script) runs on :func:`builtin_calls`, the engine's and the diffusion
pipeline's own defaults with no plugin at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenops.types import GatewayRequest, ReasoningBudget

if TYPE_CHECKING:
    from tokenops.diffusion.samplers import DiffusionPlan
    from tokenops.engine.core.config import EngineConfig


@dataclass(frozen=True, slots=True)
class PluginCalls:
    #: adjust and check an engine config once, at start (``tokenops_engine_config``)
    configure_engine: Callable[[EngineConfig], EngineConfig]
    #: an engine for a configured config, with the plugins' policies (proposers, KV policy...)
    build_engine: Callable[[EngineConfig], Any]
    #: the thinking budget of one chat request to a reasoning model (``tokenops_reasoning_budget``)
    reasoning_budget: Callable[[GatewayRequest, str], ReasoningBudget | None]
    #: the sampler/steps/step-cache plan of one image request: (model, sampler, steps) -> plan
    diffusion_plan: Callable[[str, str, int], DiffusionPlan]


def _configure_builtin(config: EngineConfig) -> EngineConfig:
    from tokenops.engine.core.policies import EnginePolicies

    policies = EnginePolicies()  # the built-in queue orders and proposers: names outside them are refused now
    policies.schedule_order(config.schedule_policy)
    if config.speculative:
        policies.proposer_factory(config.speculative)
    return config


def _build_builtin(config: EngineConfig) -> Any:
    from tokenops.engine.core.engine import LLMEngine

    return LLMEngine(config)


def _no_budget(request: GatewayRequest, model: str) -> ReasoningBudget | None:
    return None


def _default_plan(model: str, sampler: str, num_steps: int) -> DiffusionPlan:
    from tokenops.diffusion.samplers import DiffusionPlan

    return DiffusionPlan(sampler=sampler, num_steps=num_steps)


def builtin_calls() -> PluginCalls:
    """No plugin: the engine's built-in policies, no thinking budget, the pipeline's own plan."""
    return PluginCalls(
        configure_engine=_configure_builtin,
        build_engine=_build_builtin,
        reasoning_budget=_no_budget,
        diffusion_plan=_default_plan,
    )
