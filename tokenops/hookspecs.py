"""Every hook a tokenops plugin can implement, grouped by layer.

Layers (see docs/architecture.md):

1. multi-model fusion — which model answers (gateway, per request)
2. model optimization — how cheaply one model makes a token (engine)
3. compute-model fusion — how the engine runs on the hardware (engine + tuner)
4. compute-network-model fusion — how traffic meets replicas (gateway)

``docs/hooks.md`` documents each hook with its exact signature; a test fails
when the two disagree.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("tokenops")

#: hook name -> layer, filled by the ``@layer`` decorator below; used to group
#: plugins by layer in ``tokenops plugins``.
HOOK_LAYERS: dict[str, str] = {}

LAYERS = ("setup", "multi_model", "model_optimization", "compute_model", "compute_network", "telemetry")


def _layer(name: str) -> Callable:
    assert name in LAYERS

    def mark(fn: Callable) -> Callable:
        HOOK_LAYERS[fn.__name__] = name
        return fn

    return mark


# ---------------------------------------------------------------------------
# Setup and lifecycle
# ---------------------------------------------------------------------------


@hookspec
@_layer("setup")
def tokenops_register_backends(register: Callable[[str, Any], None]) -> None:
    """Contribute backend kinds (``local``, ``openai``, ...).

    Called once when the gateway builds its backends.

    :param register: ``register(kind, factory)``; ``factory(model_config, settings)``
        returns an object implementing :class:`tokenops.backends.Backend`.
    """


@hookspec
@_layer("setup")
def tokenops_register_tunables(register: Callable[[Any], None]) -> None:
    """Declare tunables owned by this plugin.

    Called once when the tunables registry is first read.

    :param register: ``register(Tunable(...))`` with a :class:`tokenops.tunables.Tunable`.
    """


@hookspec
@_layer("setup")
def tokenops_register_commands(app: Any) -> None:
    """Add CLI commands.

    Called while the ``tokenops`` typer app is built.

    :param app: the root :class:`typer.Typer`; call ``app.command()`` or ``app.add_typer()``.
    """


@hookspec
@_layer("setup")
def tokenops_register_workloads(register: Callable[[str, Any], None]) -> None:
    """Contribute benchmark workloads.

    Called when ``tokenops bench`` or ``tokenops tune`` resolves a workload name.

    :param register: ``register(name, factory)``; ``factory(**options)`` returns an
        iterable of benchmark requests.
    """


@hookspec
@_layer("setup")
def tokenops_apply_tunables(values: dict[str, Any]) -> None:
    """Apply live tunable changes owned by plugins.

    Called after ``PATCH /admin/tunables`` (or the tuner) validated a patch against
    the registry; each plugin picks the names it owns and ignores the rest.

    :param values: ``{tunable name: validated value}`` of the changed tunables.
    """


@hookspec(historic=True)
@_layer("setup")
def tokenops_configure(settings: Any) -> None:
    """Receive the loaded settings.

    Historic: plugins registered after configuration still receive the call.

    :param settings: the :class:`tokenops.config.Settings` in force.
    """


# ---------------------------------------------------------------------------
# Layer 1: multi-model fusion (gateway, per request)
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
@_layer("multi_model")
def tokenops_route(request: Any, candidates: list[str], profiles: dict[str, Any]) -> Any:
    """Choose the model that answers a request.

    Called once per request after admission and cache lookup.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param candidates: model names that are configured and may serve it.
    :param profiles: model name -> capability profile (may be empty).
    :returns: a :class:`tokenops.types.RouteDecision`, or None to pass.
        First non-None result wins.
    """


@hookspec
@_layer("multi_model")
def tokenops_validate(request: Any, response: Any) -> float | None:
    """Score a response: the gateway records the lowest score, and a cascade escalates on it.

    Called after every successful backend answer, whether or not a cascade is configured:
    each non-streamed model call (every cascade step and ensemble member included) and each
    completed stream, but not for answers served from the cache. The lowest score of all
    validators goes into the request's decisions (``validate``); when the route is a cascade
    (:class:`tokenops.types.RouteDecision` with ``escalate_to`` and ``min_score``), a score
    below ``min_score`` asks the next model.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param response: the :class:`tokenops.types.GatewayResponse`.
    :returns: a quality score in [0, 1], or None when this validator does not apply.
    """


@hookspec(firstresult=True)
@_layer("multi_model")
def tokenops_ensemble(request: Any, responses: list[Any]) -> Any:
    """Combine several responses into one.

    Called when a request asked for an ensemble alias (e.g. ``ensemble:vote``).

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param responses: the member :class:`tokenops.types.GatewayResponse` objects.
    :returns: the combined response, or None to pass. First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("multi_model")
def tokenops_fallback(request: Any, error: Any) -> str | None:
    """Pick another model after a failure.

    Called when the chosen backend failed (error, timeout, overload, context length).

    :param request: the :class:`tokenops.types.GatewayRequest` (``request.attempts`` lists tried models).
    :param error: the :class:`tokenops.types.BackendError`.
    :returns: the model name to try next, or None to give up. First non-None result wins.
    """


# ---------------------------------------------------------------------------
# Layer 2: model optimization (engine)
# ---------------------------------------------------------------------------


@hookspec
@_layer("model_optimization")
def tokenops_transform_model(model: Any, config: Any) -> Any:
    """Transform a model after loading (quantization, pruning).

    Called once per loaded model, in plugin order.

    :param model: the ``torch.nn.Module``.
    :param config: the :class:`tokenops.engine.config.EngineConfig`.
    :returns: a replacement module, or None to keep it.
    """


@hookspec(firstresult=True)
@_layer("model_optimization")
def tokenops_draft_proposer(config: Any) -> Any:
    """Provide a speculative-decoding proposer.

    Called once when the engine starts.

    :param config: the :class:`tokenops.engine.config.EngineConfig`.
    :returns: a proposer object, or None. First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("model_optimization")
def tokenops_fit_context(request: Any, window: Any) -> Any:
    """Fit a chat conversation into the routed model's context (session memory).

    Called for every chat request that carries a session id (``x-session-id``
    header or ``user``) after routing, before the backend call, in a worker thread. A plugin may store the request's turns and replace
    ``request.messages`` (drop old turns, inject recalled ones) so the prompt plus
    the completion fit, instead of the backend failing with context_length_exceeded.

    :param request: the :class:`tokenops.types.GatewayRequest` (``tenant``, ``session_id``).
    :param window: a :class:`tokenops.memory.fit.ContextWindow`: ``max_model_len``
        (None when unknown) and ``count_tokens(messages) -> int``.
    :returns: a dict saying what was done (kept under the request's decisions as
        ``memory``), or None. First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("model_optimization")
def tokenops_kv_policy(config: Any) -> Any:
    """Provide a KV-cache eviction or compression policy.

    Called once when the engine allocates its KV cache.

    :param config: the :class:`tokenops.engine.config.EngineConfig`.
    :returns: a policy object, or None. First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("model_optimization")
def tokenops_expert_placement(load: list[list[float]], num_devices: int, num_redundant: int, num_nodes: int) -> Any:
    """Plan MoE expert replication and placement (EPLB).

    Called by ``tokenops moe plan`` and by the gateway when it shows a plan for a
    MoE model's recorded load.

    :param load: per-layer, per-expert token counts (``load[layer][expert]``).
    :param num_devices: devices (GPUs) the experts are spread over.
    :param num_redundant: extra expert replicas allowed per layer (slots = experts + redundant).
    :param num_nodes: nodes the devices are grouped in (1 = one flat pool).
    :returns: a :class:`tokenops_plugins.model_optimization.eplb.PlacementPlan`-like object
        with ``layers`` (per-layer placement) and ``balancedness_before/after``, or None.
        First non-None result wins.
    """


@hookspec
@_layer("model_optimization")
def tokenops_diffusion_plan(model: str, plan: Any) -> None:
    """Choose how one image generation walks its denoising path.

    Called by the ``diffusion`` backend for every image request, before the
    request's own overrides (``sampler``, ``num_inference_steps``,
    ``step_cache_threshold``) are applied.

    :param model: the served model's name.
    :param plan: the mutable :class:`tokenops.diffusion.plan.DiffusionPlan` (``sampler``,
        ``num_steps``, ``cache``: a :class:`tokenops.diffusion.step_cache.StepCachePolicy`),
        holding the pipeline folder's defaults; plugins set the parts they own.
    """


@hookspec(firstresult=True)
@_layer("model_optimization")
def tokenops_reasoning_budget(request: Any, model: str) -> Any:
    """Pick the thinking budget of one chat request to a reasoning model.

    Called by the bundled engine's adapter, in a worker thread, for every chat request
    to a model with a ``reasoning_parser``, before the request enters the engine. The
    engine enforces the answer by budget forcing: once the thinking block holds
    ``max_thinking_tokens`` tokens it appends the closing tag itself and the model answers.

    :param request: the :class:`tokenops.types.GatewayRequest` (its body may carry
        ``reasoning_effort`` or the ``max_thinking_tokens`` extension).
    :param model: the served model's name.
    :returns: a :class:`tokenops.types.ReasoningBudget` (``max_thinking_tokens``, None for
        unlimited; ``suppress``, reflection words masked while thinking; ``reason``), or
        None to leave thinking unlimited. A request that names a budget and gets None is
        answered with a 400. First non-None result wins.
    """


# ---------------------------------------------------------------------------
# Layer 3: compute-model fusion (engine + tuner)
# ---------------------------------------------------------------------------


@hookspec
@_layer("compute_model")
def tokenops_engine_config(config: Any) -> None:
    """Adjust the engine configuration before the engine starts.

    :param config: the mutable :class:`tokenops.engine.config.EngineConfig`.
    """


@hookspec(firstresult=True)
@_layer("compute_model")
def tokenops_compile_model(model: Any) -> Any:
    """Compile the model's forward (e.g. ``torch.compile``).

    :param model: the ``torch.nn.Module``.
    :returns: the compiled module, or None. First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("compute_model")
def tokenops_schedule_order(waiting: list[Any], policy: str) -> list[Any] | None:
    """Order the engine's waiting queue.

    Called each scheduler step that has waiting sequences.

    :param waiting: the waiting :class:`tokenops.engine.sequence.Sequence` objects.
    :param policy: the configured policy name (``fcfs``, ``priority``, ...).
    :returns: the reordered list, or None when this plugin does not own ``policy``.
        First non-None result wins.
    """


@hookspec
@_layer("compute_model")
def tokenops_register_launchers(register: Callable[[str, Any], None]) -> None:
    """Contribute servers that ``tokenops tune --launch --engine NAME`` can start.

    Called when the tuner resolves ``--engine`` (and by ``tokenops plugins``). A
    launcher turns a configuration of restart tunables (those under its prefixes,
    e.g. ``vllm.``) into a command line and environment; the tuner relaunches it
    for every configuration it measures.

    :param register: ``register(name, factory)``; ``factory(options)`` takes a
        :class:`tokenops.tune.launcher.LaunchOptions` (model, command, extra args,
        ready timeout) and returns a :class:`tokenops.tune.launcher.Launcher`.
        A name registered twice is an error.
    """


# ---------------------------------------------------------------------------
# Layer 4: compute-network-model fusion (gateway)
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
@_layer("compute_network")
def tokenops_admit(request: Any) -> Any:
    """Admit or reject a request (rate limits, quotas).

    Called first for every request.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :returns: a :class:`tokenops.types.Rejection` to refuse it, or None to admit.
        First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("compute_network")
def tokenops_cache_lookup(request: Any) -> Any:
    """Answer a request from a cache.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :returns: a cached :class:`tokenops.types.GatewayResponse`, or None on a miss.
        First non-None result wins.
    """


@hookspec
@_layer("compute_network")
def tokenops_cache_store(request: Any, response: Any) -> None:
    """Offer a finished response to caches.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param response: the :class:`tokenops.types.GatewayResponse`.
    """


@hookspec(firstresult=True)
@_layer("compute_network")
def tokenops_select_replica(request: Any, replicas: list[Any]) -> Any:
    """Choose the replica of the routed model that serves the request.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param replicas: the healthy replicas (objects with ``name`` and ``backend``).
    :returns: one of ``replicas``, or None to pass. First non-None result wins.
    """


@hookspec
@_layer("compute_network")
def tokenops_backend_outcome(backend: str, outcome: Any) -> None:
    """Observe how a backend call ended (circuit breakers, load tracking).

    :param backend: the replica name.
    :param outcome: the :class:`tokenops.types.BackendOutcome`.
    """


@hookspec(firstresult=True)
@_layer("compute_network")
def tokenops_replica_states() -> dict[str, str] | None:
    """Health state of each replica a breaker tracks, for ``/admin/stats``, ``/metrics`` and the dashboard.

    :returns: replica name -> ``closed``, ``open``, ``half_open`` or ``ejected``; first non-None result wins.
    """


# ---------------------------------------------------------------------------
# Telemetry
# ---------------------------------------------------------------------------


@hookspec
@_layer("telemetry")
def tokenops_record(event: Any) -> None:
    """Receive a telemetry event (a finished request, engine stats, expert load).

    Must not block: sinks queue and write in the background.

    :param event: a :class:`tokenops.types.TelemetryEvent`.
    """
