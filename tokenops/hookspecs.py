"""Every hook a tokenops plugin can implement, grouped by layer.

Layers (see docs/architecture.md):

1. multi-model fusion — which model answers (gateway, per request)
2. model optimization — how cheaply one model makes a token (engine)
3. compute-model fusion — how the engine runs on the hardware (engine + tuner)
4. compute-network-model fusion — how traffic meets replicas (gateway)

Each spec is typed (the types are imported only for type checkers, as pytest's
hookspec.py does) and its docstring says when it is called, each parameter, what it
returns, and on which thread it runs (the ``Runs on:`` line):

- *the event loop*: the gateway's asyncio loop, which serves every connection; an
  implementation that blocks (CPU work, disk or network I/O) stalls every client,
  ``/health`` included. The hooks in :data:`tokenops.blocking.MAY_BLOCK_HOOKS` move to a
  worker thread when an implementation is marked :func:`tokenops.may_block`; the others
  must stay cheap.
- *a worker thread*: ``asyncio.to_thread`` from the gateway; blocking is fine, but
  implementations run concurrently for concurrent requests, so shared state needs a lock.
- *the engine thread*: the bundled engine's step loop; time spent there delays every
  sequence in the batch.
- *build time*: once, while the gateway, an engine or the CLI is set up.

``firstresult`` hooks stop at the first implementation that returns something other
than None: the first non-None result wins, and None means "pass".

``docs/hooks.md`` is generated from this file (``scripts/gen_hooks_doc.py``); a test
fails when the two disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

if TYPE_CHECKING:
    import torch
    import typer

    from tokenops.backends.base import Replica
    from tokenops.backends.registry import BackendFactory
    from tokenops.bench.workloads import BenchRequest
    from tokenops.config import Settings
    from tokenops.diffusion.plan import DiffusionPlan
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.protocols import KVPolicy, ProposerFactory, ScheduleOrder
    from tokenops.gateway.observability.records import RequestRecord
    from tokenops.memory.fit import ContextWindow
    from tokenops.store import Store
    from tokenops.tunables import Tunable
    from tokenops.tune.launcher import LauncherFactory
    from tokenops.types import (
        BackendError,
        BackendOutcome,
        EnsembleFollowUp,
        GatewayRequest,
        GatewayResponse,
        ReasoningBudget,
        Rejection,
        RouteDecision,
        TelemetryEvent,
    )

hookspec = pluggy.HookspecMarker("tokenops")

#: hook name -> layer, filled by the ``@layer`` decorator below; used to group
#: plugins by layer in ``tokenops plugins``.
HOOK_LAYERS: dict[str, str] = {}

LAYERS = ("setup", "multi_model", "model_optimization", "compute_model", "compute_network", "telemetry")

#: Parameters and returns typed ``Any`` on purpose, with the reason (a test fails on an
#: ``Any`` that is not listed here).
UNTYPED: dict[str, str] = {
    "tokenops_expert_placement.return": "the plan type belongs to the eplb plugin; the gateway reads summary(), "
    "the CLI to_dict(), layers and balancedness_before/after",
}

F = TypeVar("F", bound=Callable[..., Any])


def _layer(name: str) -> Callable[[F], F]:
    assert name in LAYERS

    def mark(fn: F) -> F:
        HOOK_LAYERS[fn.__name__] = name
        return fn

    return mark


# ---------------------------------------------------------------------------
# Setup and lifecycle
# ---------------------------------------------------------------------------


@hookspec
@_layer("setup")
def tokenops_register_backends(register: Callable[[str, BackendFactory], None]) -> None:
    """Contribute backend kinds (``local``, ``openai``, ...).

    Called once when the gateway builds its replicas from the settings.

    Runs on: build time. In the thread that builds the gateway app (``tokenops serve``'s main
    thread), before any request.

    :param register: ``register(kind, factory)``; ``factory(model_config, settings)``
        returns an object implementing :class:`tokenops.backends.Backend`.
    """


@hookspec
@_layer("setup")
def tokenops_register_tunables(register: Callable[[Tunable], None]) -> None:
    """Declare tunables owned by this plugin.

    Called once, when the tunables registry is first read (serve, tune, the admin API).

    Runs on: build time. In whichever thread first reads the registry (the CLI main thread
    or a gateway worker thread); the registry is built once, under a lock.

    :param register: ``register(Tunable(...))`` with a :class:`tokenops.tunables.Tunable`.
    """


@hookspec
@_layer("setup")
def tokenops_register_decisions(register: Callable[[str, Any], None]) -> None:
    """Declare the decision keys this plugin writes into ``GatewayRequest.decisions`` (with
    ``request.decide(key, value)`` or ``add_decision``) and their types. The core declares only its
    own keys (``tokenops.types.Decisions``); a key nobody declared, or a value of another type, is
    refused when written (``DecisionError``), so a typo fails the first request, not the report.

    Called once, when the plugin is registered (before any request can write its keys); a key the
    core owns, or one another plugin declared with other types, fails the load with one line.

    Runs on: build time. In the thread that loads the plugins (the CLI main thread, or a test's).

    :param register: ``register(key, type)``: ``key`` a name, ``type`` an annotation of its values
        (``str``, ``float``, ``dict[str, Any]``, ``str | dict[str, float]``, a TypedDict); a
        ``dict``/TypedDict value is checked as a dict, ``float`` takes an int, ``Any`` anything.
    """


@hookspec
@_layer("setup")
def tokenops_tunable_values(config: EngineConfig) -> dict[str, Any] | None:
    """The values this plugin's tunables have in one running bundled engine.

    A restart tunable's registry default says nothing about what runs: ``[plugins.NAME]`` tables
    and per-model ``engine = {...}`` set it. The admin API (``GET /admin/tunables``), the dashboard's
    Tuning screen and ``tokenops models --url`` show what this returns for the engines serving.

    Called once per bundled-engine replica after the backends started.

    Runs on: the event loop (the gateway's start-up task), after every backend started.

    :param config: the engine's final :class:`tokenops.engine.core.config.EngineConfig` (after
        ``tokenops_engine_config``).
    :returns: ``{tunable name: value}`` for the tunables this plugin owns, or None.
    """


@hookspec
@_layer("setup")
def tokenops_register_commands(app: typer.Typer) -> None:
    """Add CLI commands.

    Called while the ``tokenops`` typer app is built.

    Runs on: the CLI main thread. At build time.

    :param app: the root :class:`typer.Typer`; call ``app.command()`` or ``app.add_typer()``.
    """


@hookspec
@_layer("setup")
def tokenops_register_workloads(register: Callable[[str, Callable[..., list[BenchRequest]]], None]) -> None:
    """Contribute benchmark workloads.

    Called when ``tokenops bench`` or ``tokenops tune`` resolves a workload name.

    Runs on: the CLI main thread. At build time.

    :param register: ``register(name, factory)``; ``factory(**options)`` returns a
        list of :class:`tokenops.bench.workloads.BenchRequest`.
    """


@hookspec
@_layer("setup")
def tokenops_apply_tunables(values: dict[str, bool | int | float | str]) -> None:
    """Apply live tunable changes owned by plugins.

    Called after ``PATCH /admin/tunables`` (the dashboard and the tuner use it) validated
    a patch against the registry; each plugin picks the names it owns and ignores the rest.

    Runs on: a worker thread. The admin handler applies the patch off the event loop, while
    requests keep flowing: swap state in whole objects or under a lock.

    :param values: ``{tunable name: validated value}`` of the changed tunables, each of its
        tunable's declared type.
    """


@hookspec
@_layer("setup")
def tokenops_tenant_deleted(tenant: str, store: Store | None) -> dict[str, int] | None:
    """Forget everything a plugin keeps for a tenant that is being deleted.

    Called by ``DELETE /admin/tenants/{name}`` (and ``tokenops keys delete-tenant`` when no
    server runs) after the tenant's keys are revoked and its record removed. A plugin that
    keeps per-tenant data (session memory, captured distillation pairs, cached answers)
    deletes it here; the caller reports the counts to the operator.

    Runs on: a worker thread. The admin handler runs it off the event loop, so an
    implementation may block (delete rows, flush a queue).

    :param tenant: the tenant's name.
    :param store: the :class:`tokenops.store.Store` the server or CLI writes (None with
        ``--no-store``), for plugins whose data lives there.
    :returns: ``{what: number deleted}`` (e.g. ``{"distill_pairs": 12}``), or None when the
        plugin keeps nothing for tenants. All results are merged.
    """


@hookspec(historic=True)
@_layer("setup")
def tokenops_configure(settings: Settings) -> None:
    """Receive the loaded settings.

    Called once when the gateway is built, before its replicas (plugins may adjust engine
    configs), and by ``tokenops keys`` (routers name their aliases). Historic: a plugin
    registered after configuration still receives the call, at registration.

    Runs on: build time. In the thread that builds the gateway app (``tokenops serve``'s main
    thread) or the CLI main thread; a late registration calls it in the registering thread.

    :param settings: the :class:`tokenops.config.Settings` in force.
    """


# ---------------------------------------------------------------------------
# Layer 1: multi-model fusion (gateway, per request)
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
@_layer("multi_model")
def tokenops_route(
    request: GatewayRequest, candidates: list[str], profiles: dict[str, dict[str, Any]]
) -> RouteDecision | None:
    """Choose the model that answers a request.

    Called once per request after admission and cache lookup.

    Runs on: the event loop, or a worker thread if an implementation is ``@may_block``. A
    router that embeds or classifies the text is marked so; prompts over 64 KiB are routed in
    a worker thread too. An unmarked implementation must not block.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param candidates: model names that are configured and may serve it.
    :param profiles: model name -> capability profile (the parsed profile document; may be empty).
    :returns: a :class:`tokenops.types.RouteDecision`, or None to pass. A ``ValueError``
        refuses the request with a 400 naming the model. First non-None result wins.
    """


@hookspec
@_layer("multi_model")
def tokenops_validate(request: GatewayRequest, response: GatewayResponse) -> float | None:
    """Score a response: the gateway records the lowest score, and a cascade escalates on it.

    Called after every successful backend answer, whether or not a cascade is configured:
    each non-streamed model call (every cascade step and ensemble member included) and each
    completed stream, but not for answers served from the cache. The lowest score of all
    validators goes into the request's decisions (``validate``); when the route is a cascade
    (:class:`tokenops.types.RouteDecision` with ``escalate_to`` and ``min_score``), a score
    below ``min_score`` asks the next model.

    Runs on: the event loop, or a worker thread if an implementation is ``@may_block``. Mark a
    validator that calls a judge model or runs code; an unmarked implementation must not block.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param response: the :class:`tokenops.types.GatewayResponse`.
    :returns: a quality score in [0, 1], or None when this validator does not apply.
    """


@hookspec(firstresult=True)
@_layer("multi_model")
def tokenops_ensemble(
    request: GatewayRequest, responses: list[GatewayResponse]
) -> GatewayResponse | EnsembleFollowUp | None:
    """Combine several responses into one.

    Called when the route is an ensemble (a :class:`tokenops.types.RouteDecision` with
    ``members``, e.g. the alias ``ensemble:vote``), once every member answered.

    Runs on: the event loop, or a worker thread if an implementation is ``@may_block``. An
    unmarked implementation must not block.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param responses: the member :class:`tokenops.types.GatewayResponse` objects that answered.
    :returns: the combined response; an :class:`tokenops.types.EnsembleFollowUp` when a judge
        or aggregator model has the last word; or None to pass (the first member's answer is
        used). First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("multi_model")
def tokenops_fallback(request: GatewayRequest, error: BackendError) -> str | None:
    """Pick another model after a failure.

    Called when the chosen backend failed (error, timeout, overload, context length) and
    no other replica of the same model could take the request.

    Runs on: the event loop. Must not block.

    :param request: the :class:`tokenops.types.GatewayRequest` (``request.attempts`` lists tried models).
    :param error: the :class:`tokenops.types.BackendError`.
    :returns: the model name to try next, or None to give up. First non-None result wins.
    """


# ---------------------------------------------------------------------------
# Layer 2: model optimization (engine)
# ---------------------------------------------------------------------------


@hookspec
@_layer("model_optimization")
def tokenops_transform_model(model: torch.nn.Module, config: EngineConfig) -> torch.nn.Module | None:
    """Transform a model after loading (quantization, pruning).

    Called once per loaded model while the bundled engine is built, before its weights are
    packed and the model compiled (``tokenops serve`` passes it to the engine as a weight
    transform, see :mod:`tokenops.policy_hooks`; an engine built without plugins has none).
    Every implementation gets the loaded model; the last non-None replacement is kept.

    Runs on: build time. In the thread that builds the engine (a gateway worker thread
    for ``tokenops serve``).

    :param model: the ``torch.nn.Module``.
    :param config: the :class:`tokenops.engine.core.config.EngineConfig`.
    :returns: a replacement module, or None to keep it.
    """


@hookspec
@_layer("model_optimization")
def tokenops_register_proposers(register: Callable[[str, ProposerFactory], None]) -> None:
    """Contribute speculative-decoding proposers, selectable by name.

    Called once each time ``tokenops serve`` builds a bundled engine (and when it checks an
    engine config at start): ``EngineConfig.speculative`` (``[engine] speculative`` or
    ``[plugins.speculative] method``) picks one of the registered names. ``ngram`` and
    ``draft`` are built into the engine; registering one of those names replaces the
    built-in, registering a name another plugin registered is an error.

    Runs on: build time. In the thread that builds the engine (a gateway worker thread for
    ``tokenops serve``); the proposer's methods then run on the engine thread.

    :param register: ``register(name, factory)``; ``factory(config)`` gets the engine's final
        :class:`tokenops.engine.core.config.EngineConfig` and returns a
        :class:`tokenops.engine.core.protocols.Proposer`.
    """


@hookspec(firstresult=True)
@_layer("model_optimization")
def tokenops_fit_context(request: GatewayRequest, window: ContextWindow) -> dict[str, Any] | None:
    """Fit a chat conversation into the routed model's context (session memory).

    Called for every chat request that carries a session id (``x-session-id``
    header or ``user``) after routing, before the backend call. A plugin may store the
    request's turns and replace ``request.messages`` (drop old turns, inject recalled ones)
    so the prompt plus the completion fit, instead of the backend failing with
    context_length_exceeded.

    Runs on: a worker thread. Blocking work such as embedding is fine.

    :param request: the :class:`tokenops.types.GatewayRequest` (``tenant``, ``session_id``).
    :param window: a :class:`tokenops.memory.fit.ContextWindow`: ``max_model_len``
        (None when unknown) and ``count_tokens(messages) -> int``.
    :returns: a dict saying what was done (kept under the request's decisions as
        ``memory``), or None. First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("model_optimization")
def tokenops_kv_policy(config: EngineConfig) -> KVPolicy | None:
    """Provide a KV-cache eviction or compression policy, replacing the built-in one.

    Called once each time ``tokenops serve`` builds a bundled engine. With no policy from
    a plugin the engine uses its built-in sink + window eviction when ``kv_window_tokens`` is
    set, and keeps every block otherwise.

    Runs on: build time. In the thread that builds the engine (a gateway worker thread for
    ``tokenops serve``); the policy's ``blocks_to_evict`` then runs on the engine thread.

    :param config: the :class:`tokenops.engine.core.config.EngineConfig`.
    :returns: a :class:`tokenops.engine.core.protocols.KVPolicy`, or None. First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("model_optimization")
def tokenops_expert_placement(load: list[list[float]], num_devices: int, num_redundant: int, num_nodes: int) -> Any:
    """Plan MoE expert replication and placement (EPLB).

    Called by ``tokenops moe plan``, and by the gateway when a MoE replica's recorded expert
    load changed (at most once per ``[plugins.eplb] plan_interval_s`` per replica) as it
    answers ``/metrics`` or ``/admin/stats``.

    Runs on: the CLI main thread, or the gateway thread that computes engine stats. That is a
    worker thread for ``/admin/stats`` but the event loop for ``/metrics``: keep it fast.

    :param load: per-layer, per-expert token counts (``load[layer][expert]``).
    :param num_devices: devices (GPUs) the experts are spread over.
    :param num_redundant: extra expert replicas allowed per layer (slots = experts + redundant).
    :param num_nodes: nodes the devices are grouped in (1 = one flat pool).
    :returns: a :class:`tokenops_plugins.model_optimization.eplb.PlacementPlan`-like object
        with ``layers`` (per-layer placement) and ``balancedness_before/after``, or None.
        A ``ValueError`` says the experts do not fit the devices. First non-None result wins.
    """


@hookspec
@_layer("model_optimization")
def tokenops_diffusion_plan(model: str, plan: DiffusionPlan) -> None:
    """Choose how one image generation walks its denoising path.

    Called by the ``diffusion`` backend for every image request, before the
    request's own overrides (``sampler``, ``num_inference_steps``,
    ``step_cache_threshold``) are applied.

    Runs on: the event loop. Must not block (the denoising itself runs in a worker thread).

    :param model: the served model's name.
    :param plan: the mutable :class:`tokenops.diffusion.plan.DiffusionPlan` (``sampler``,
        ``num_steps``, ``cache``: a :class:`tokenops.diffusion.step_cache.StepCachePolicy`),
        holding the pipeline folder's defaults; plugins set the parts they own.
    """


@hookspec(firstresult=True)
@_layer("model_optimization")
def tokenops_reasoning_budget(request: GatewayRequest, model: str) -> ReasoningBudget | None:
    """Pick the thinking budget of one chat request to a reasoning model.

    Called by the bundled engine's adapter for every chat request to a model with a
    ``reasoning_parser``, before the request enters the engine. The engine enforces the
    answer by budget forcing: once the thinking block holds ``max_thinking_tokens`` tokens
    it appends the closing tag itself and the model answers.

    Runs on: a worker thread. A budget model may run here.

    :param request: the :class:`tokenops.types.GatewayRequest` (its body may carry
        ``reasoning_effort`` or the ``max_thinking_tokens`` extension).
    :param model: the served model's name.
    :returns: a :class:`tokenops.types.ReasoningBudget` (``max_thinking_tokens``, None for
        unlimited; ``suppress``, reflection words masked while thinking; ``reason``), or
        None to leave thinking unlimited. A request that names a budget and gets None is
        answered with a 400. First non-None result wins.
    """


@hookspec
@_layer("model_optimization")
def tokenops_wants_logprobs(request: GatewayRequest, model: str) -> bool | None:
    """Ask the backend for an answer's token logprobs on a plugin's behalf.

    Called once per routed answer (a single model or a cascade's first tier; not for
    ensembles or cache hits), streamed or not, before the backend call. When any
    implementation returns True the gateway asks the backend for logprobs: choice 0's land
    in ``GatewayResponse.token_logprobs`` for ``tokenops_cache_store``, and they are removed
    from the client's answer (body or stream) when the client did not ask for logprobs.
    The distillation capture uses it to keep the teacher's confidence with each pair.

    Runs on: the event loop. Must not block.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param model: the routed model's name.
    :returns: True to ask for logprobs; False or None to leave the request as it is.
    """


# ---------------------------------------------------------------------------
# Layer 3: compute-model fusion (engine + tuner)
# ---------------------------------------------------------------------------


@hookspec
@_layer("compute_model")
def tokenops_engine_config(config: EngineConfig) -> None:
    """Adjust the engine configuration before the engine starts.

    Called once per bundled-engine backend when the gateway builds it, so the combination
    is checked at startup (:func:`tokenops.policy_hooks.configure_engine`); an engine
    built directly (``LLMEngine(config)``) does not call it.

    Runs on: build time. In the thread that builds the gateway app.

    :param config: the mutable :class:`tokenops.engine.core.config.EngineConfig`.
    """


@hookspec(firstresult=True)
@_layer("compute_model")
def tokenops_compile_model(model: torch.nn.Module) -> torch.nn.Module | None:
    """Compile the model's forward (e.g. ``torch.compile``).

    Called once per loaded model while ``tokenops serve`` builds a bundled engine, after
    ``tokenops_transform_model`` and weight packing (an engine built without plugins
    compiles nothing).

    Runs on: build time. In the thread that builds the engine (a gateway worker thread for
    ``tokenops serve``); the compiled forward then runs on the engine thread.

    :param model: the ``torch.nn.Module``.
    :returns: the compiled module, or None. First non-None result wins.
    """


@hookspec
@_layer("compute_model")
def tokenops_register_schedule_orders(register: Callable[[str, ScheduleOrder], None]) -> None:
    """Contribute waiting-queue orders, selectable by name.

    Called once each time ``tokenops serve`` builds a bundled engine (and when it checks an
    engine config at start, and builds the tunables registry): ``[engine] schedule_policy``
    (a live tunable) picks one of the registered names. ``fcfs`` and ``priority`` are built
    into the engine; registering one of those names replaces the built-in, registering a
    name another plugin registered is an error.

    Runs on: build time. In the thread that builds the engine; the order itself then runs on
    the engine thread in every scheduler step with waiting sequences: keep it fast.

    :param register: ``register(name, order)``; ``order(waiting)`` takes the waiting
        :class:`tokenops.engine.core.sequence.Sequence` objects and returns them in admission
        order (a :class:`tokenops.engine.core.protocols.ScheduleOrder`).
    """


@hookspec
@_layer("compute_model")
def tokenops_register_launchers(register: Callable[[str, LauncherFactory], None]) -> None:
    """Contribute servers that ``tokenops tune --launch --engine NAME`` can start.

    Called when the tuner resolves ``--engine``, by ``tokenops plugins`` and by
    ``GET /admin/tunables``. A launcher turns a configuration of restart tunables (those
    under its prefixes, e.g. ``vllm.``) into a command line and environment; the tuner
    relaunches it for every configuration it measures.

    Runs on: build time. The CLI main thread, or a gateway worker thread for the admin API.

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
def tokenops_admit(request: GatewayRequest) -> Rejection | None:
    """Admit or reject a request (rate limits, quotas).

    Called first for every request.

    Runs on: a worker thread. A rate limiter may queue here, an admission plugin read the store.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :returns: a :class:`tokenops.types.Rejection` to refuse it, or None to admit.
        First non-None result wins.
    """


@hookspec(firstresult=True)
@_layer("compute_network")
def tokenops_cache_lookup(request: GatewayRequest) -> GatewayResponse | None:
    """Answer a request from a cache.

    Called for every request after admission, before routing.

    Runs on: a worker thread. A semantic cache embeds the prompt here.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :returns: a cached :class:`tokenops.types.GatewayResponse`, or None on a miss.
        First non-None result wins.
    """


@hookspec
@_layer("compute_network")
def tokenops_cache_store(request: GatewayRequest, response: GatewayResponse) -> None:
    """Offer a finished response to caches (and to plugins that settle a request's cost).

    Called after every successful backend answer, right after ``tokenops_validate`` (not for
    answers served from the cache).

    Runs on: the event loop, or a worker thread if an implementation is ``@may_block``. The
    semantic cache is marked (it embeds the question); an unmarked implementation must not block.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param response: the :class:`tokenops.types.GatewayResponse`.
    """


@hookspec(firstresult=True)
@_layer("compute_network")
def tokenops_select_replica(request: GatewayRequest, replicas: list[Replica]) -> Replica | None:
    """Choose the replica of the routed model that serves the request.

    Called for every backend call (fallbacks and retries included) with the replicas that
    are ready.

    Runs on: the event loop. Must not block.

    :param request: the :class:`tokenops.types.GatewayRequest`.
    :param replicas: the ready :class:`tokenops.backends.base.Replica` objects.
    :returns: one of ``replicas``, or None to pass (the first is used). First non-None result wins.
    """


@hookspec
@_layer("compute_network")
def tokenops_backend_outcome(backend: str, outcome: BackendOutcome) -> None:
    """Observe how a backend call ended (circuit breakers, load tracking).

    Called after every backend call, failed or not (a client that went away counts as ok).

    Runs on: the event loop. Must not block.

    :param backend: the replica name.
    :param outcome: the :class:`tokenops.types.BackendOutcome`.
    """


@hookspec(firstresult=True)
@_layer("compute_network")
def tokenops_replica_states() -> dict[str, str] | None:
    """Health state of each replica a breaker tracks, for ``/admin/stats``, ``/metrics`` and the dashboard.

    Called on every ``/metrics`` scrape and stats poll.

    Runs on: the event loop or a worker thread. ``/metrics`` asks on the loop, ``/admin/stats``
    in a worker thread: must not block.

    :returns: replica name -> ``closed``, ``open``, ``half_open`` or ``ejected``. First non-None result wins.
    """


# ---------------------------------------------------------------------------
# Telemetry
# ---------------------------------------------------------------------------


@hookspec
@_layer("telemetry")
def tokenops_request_finished(record: RequestRecord) -> None:
    """A request has finished and its record is complete: on every path (answered, refused,
    failed, disconnected, served from the cache), exactly once per request.

    Called by the gateway right after it finishes the record (status, tokens, latencies and
    decisions are final), before the ``requests`` telemetry event. The place for bookkeeping
    that settles a request (a rate limiter correcting its token charge to the tokens used).

    Runs on: the event loop. Must not block: hand slow work (a Redis round trip) to a thread.

    :param record: the :class:`tokenops.gateway.observability.records.RequestRecord` (``id``, ``tenant``,
        ``tokens_in``, ``tokens_out``, ``status``, ``decisions``...); read it, do not change it.
    """


@hookspec
@_layer("telemetry")
def tokenops_record(event: TelemetryEvent) -> None:
    """Receive a telemetry event (a finished request, engine stats, expert load).

    Called when a request finishes (kind ``requests``, ``image_requests``), on every
    telemetry tick (``engine_stats``, ``expert_load``) and by plugins that emit rows
    (``distill_pairs``).

    Runs on: the event loop or a worker thread. Finished requests are recorded on the loop,
    telemetry ticks in a worker thread: must not block (sinks queue and write in the background).

    :param event: a :class:`tokenops.types.TelemetryEvent`.
    """
