"""The plugin side of the bundled engine: hooks -> :class:`EnginePolicies`, once, at build time.

The engine (:mod:`tokenops.engine`) never imports the plugin manager; it runs on the
policies it is given (:class:`tokenops.engine.core.policies.EnginePolicies`, the built-ins by
default). This module is where ``tokenops serve`` (and any caller that wants the plugins'
techniques) collects them from the hooks:

- ``tokenops_engine_config`` adjusts the config (applied once, by :func:`configure_engine`);
- ``tokenops_register_schedule_orders`` / ``tokenops_register_proposers`` add named queue
  orders and proposers to the built-in ones (a plugin may replace a built-in name, e.g. the
  ``ngram`` proposer with its ``[plugins.speculative]`` n-gram sizes; two plugins
  registering one name is an error);
- ``tokenops_kv_policy`` may replace the built-in KV policy;
- ``tokenops_transform_model`` and ``tokenops_compile_model`` become the engine's weight
  transforms and compile step when some plugin implements them.

No hook is called per engine step. :func:`plugin_calls` hands all of this (and the per-request
thinking budget and diffusion plan) to the backends, which sit below the plugin manager and
never call it (:mod:`tokenops.backends.plugin_calls`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenops.engine.core.policies import BUILTIN_PROPOSERS, BUILTIN_SCHEDULE_ORDERS, EnginePolicies
from tokenops.types import GatewayRequest, ReasoningBudget

if TYPE_CHECKING:
    from tokenops.backends.plugin_calls import PluginCalls
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine


def _named(hook_name: str, builtins: dict[str, Any], what: str) -> dict[str, Any]:
    """Built-ins plus the names each implementation of a ``register(name, obj)`` hook adds."""
    from tokenops.plugin_manager import PluginLoadError, hook

    found = dict(builtins)
    owners: dict[str, str] = {}
    for impl in getattr(hook(), hook_name).get_hookimpls():

        def register(name: str, obj: Any, _owner: str = impl.plugin_name) -> None:
            if not isinstance(name, str) or not name or not callable(obj):
                raise PluginLoadError(f"plugin {_owner!r}: {hook_name} needs register(name, callable), got {name!r}")
            if name in owners:
                raise PluginLoadError(f"{what} {name!r} is registered twice ({owners[name]} and {_owner})")
            owners[name] = _owner
            found[name] = obj

        impl.function(register=register)
    return found


def schedule_orders() -> dict[str, Any]:
    """Queue-order name -> order: fcfs and priority, plus what plugins register."""
    return _named("tokenops_register_schedule_orders", dict(BUILTIN_SCHEDULE_ORDERS), "schedule policy")


def proposers() -> dict[str, Any]:
    """Proposer name -> ``factory(config)``: ngram and draft, plus what plugins register."""
    return _named("tokenops_register_proposers", dict(BUILTIN_PROPOSERS), "speculative proposer")


def _hook_transform() -> Callable[[Any, Any], Any] | None:
    from tokenops.plugin_manager import hook

    caller = hook().tokenops_transform_model
    if not caller.get_hookimpls():
        return None

    def transform(model: Any, config: Any) -> Any:  # every implementation sees the loaded model, as the hook says
        replacements = [r for r in caller(model=model, config=config) if r is not None]
        return replacements[-1] if replacements else None

    return transform


def _hook_compile() -> Callable[[Any], Any] | None:
    from tokenops.plugin_manager import hook

    caller = hook().tokenops_compile_model
    if not caller.get_hookimpls():
        return None
    return lambda model: caller(model=model)


def collect_policies(config: EngineConfig) -> EnginePolicies:
    """The engine policies the loaded plugins provide for ``config`` (its final form: after
    :func:`configure_engine`). Each hook is called here, once."""
    from tokenops.plugin_manager import hook

    transform = _hook_transform()
    return EnginePolicies(
        schedule_orders=schedule_orders(),
        proposers=proposers(),
        kv_policy=hook().tokenops_kv_policy(config=config),
        transforms=(transform,) if transform is not None else (),
        compile=_hook_compile(),
    )


def configure_engine(config: EngineConfig) -> EngineConfig:
    """Apply ``tokenops_engine_config`` (once) and check the result, including that
    ``schedule_policy`` and ``speculative`` name an order and a proposer that are available
    (ValueError naming them otherwise). Returns ``config``."""
    from tokenops.plugin_manager import hook

    hook().tokenops_engine_config(config=config)
    config.__post_init__()  # the combination plugins produced
    check_names(config, schedule_orders(), proposers())
    return config


def check_names(config: EngineConfig, orders: dict[str, Any], props: dict[str, Any]) -> None:
    policies = EnginePolicies(schedule_orders=orders, proposers=props)
    policies.schedule_order(config.schedule_policy)
    if config.speculative:
        policies.proposer_factory(config.speculative)


def build_engine(config: EngineConfig, runner: Any = None, *, configured: bool = False) -> LLMEngine:
    """An :class:`LLMEngine` with the plugins' policies: how ``tokenops serve`` builds one.
    ``configured``: ``config`` already went through :func:`configure_engine`."""
    from tokenops.engine.core.engine import LLMEngine

    if not configured:
        configure_engine(config)
    return LLMEngine(config, runner, policies=collect_policies(config))


def reasoning_budget(request: GatewayRequest, model: str) -> ReasoningBudget | None:
    """The budget policy's answer for ``request`` (``tokenops_reasoning_budget``)."""
    from tokenops.plugin_manager import hook

    return hook().tokenops_reasoning_budget(request=request, model=model)


def plugin_calls() -> PluginCalls:
    """What the backends ask the loaded plugins (:mod:`tokenops.backends.plugin_calls`), passed
    in by the plugin that builds them; each call reaches the plugin set of the gateway active here."""
    from tokenops.backends.plugin_calls import PluginCalls
    from tokenops.diffusion.plan import get_plan

    return PluginCalls(
        configure_engine=_in_set(configure_engine),
        # the engine is built on a thread of its own, where no gateway's set is active
        build_engine=_in_set(lambda config: build_engine(config, configured=True)),
        reasoning_budget=_in_set(reasoning_budget),
        diffusion_plan=_in_set(get_plan),
    )


def _in_set(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` run with the plugin set active now (the gateway building the backend): its hooks
    reach that gateway's plugin instances from any thread (the engine thread has no context)."""
    from tokenops.plugin_sets import active

    plugins = active()
    if plugins is None:
        return call

    def in_set(*args: Any, **kwargs: Any) -> Any:
        with plugins.activate():
            return call(*args, **kwargs)

    return in_set
