"""``Gateway``: everything one running server holds — replicas, pipeline, auth,
metrics, recent requests, current tunable values — and its start/stop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from tokenops.backends import model_swap
from tokenops.backends.base import Replica
from tokenops.backends.registry import build_replicas, model_configs
from tokenops.config import ConfigError, Settings
from tokenops.gateway.auth import AdminAuth, ApiKeys, resolve_admin_key
from tokenops.gateway.core import hooks
from tokenops.gateway.core.admission import QueueLimits
from tokenops.gateway.core.model_loading import StartReport, nothing_to_serve, start_backends
from tokenops.gateway.core.pipeline import Pipeline
from tokenops.gateway.counters import GatewayCounters
from tokenops.gateway.edge.schema_budget import SchemaBudget, in_force
from tokenops.gateway.lifecycle import Lifecycle, Phase
from tokenops.gateway.observability import tracing
from tokenops.gateway.observability.expert_plans import ExpertPlans
from tokenops.gateway.observability.metrics_auth import MetricsAuth
from tokenops.gateway.observability.metrics_window import MetricsWindow
from tokenops.gateway.observability.prometheus import PrometheusMetrics
from tokenops.gateway.observability.records import RequestRecord
from tokenops.gateway.observability.replica_health import replica_states
from tokenops.gateway.observability.telemetry import EngineTelemetry
from tokenops.keys import service as key_service
from tokenops.memory import memory_store
from tokenops.plugin_manager import new_plugin_set
from tokenops.routing.retry import retry_budget
from tokenops.types import TelemetryEvent

log = logging.getLogger("tokenops.gateway")

RECENT_REQUESTS = 1000
#: After the drain deadline: how long cancelled requests get to abort and finish their records.
_CANCEL_GRACE_S = 2.0


class Gateway:
    """The state behind one FastAPI app (``app.state.gateway``): the composition root. It builds and
    owns everything one server holds — its own plugin instances (``plugins``), schema budget, span
    builder and key service, set around its requests and tasks by :meth:`scope`, never in process
    globals — so two gateways in one process share nothing. Lifecycle: built -> :meth:`begin`
    (starting, then serving) -> :meth:`begin_drain` / :meth:`drain` (draining) -> :meth:`stop`."""

    def __init__(
        self,
        settings: Settings,
        replicas: dict[str, list[Replica]] | None = None,
        *,
        store: Any = None,
        admin_key_hash: str | None = None,
        allow_open: bool = False,
        window_s: float = 60.0,
        telemetry_interval_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self.lifecycle = Lifecycle()
        self.schema_budget = SchemaBudget.from_settings(settings.gateway)
        self.plugins = new_plugin_set()  # this gateway's own plugin instances, configured below
        self.tracer: Any = None  # the span builder, once begin() finds a collector (tracing.configure)
        self.keys: Any = None
        self.memory_slot = memory_store.MemorySlot()  # the session memory its plugin serves from
        with self.scope():
            self._build(settings, replicas, store, admin_key_hash, allow_open, window_s, telemetry_interval_s)

    def _build(
        self,
        settings: Settings,
        replicas: dict[str, list[Replica]] | None,
        store: Any,
        admin_key_hash: str | None,
        allow_open: bool,
        window_s: float,
        telemetry_interval_s: float,
    ) -> None:
        # plugins first: they adjust engine configs, which are checked as the replicas are built
        try:
            self.plugins.configure(settings)
        except ValueError as e:  # a plugin refusing its [plugins.*] table: one line at start
            raise ConfigError(str(e)) from None
        try:
            self.expert_plans = ExpertPlans(settings.plugin_settings("eplb"))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.models = (
            {m.name: m for m in model_configs(settings)} if replicas is None else {m.name: m for m in settings.models}
        )
        self.replicas = replicas if replicas is not None else build_replicas(settings, hooks.get_backend_factories())
        lora_bases = [m.name for m in self.models.values() if m.lora]
        self.model_swap = model_swap.attach(settings.gateway.max_loaded_models, self.replicas, lora_bases)
        self.store = store
        self.api_keys = ApiKeys(settings.gateway.api_keys, allow_open=allow_open)
        if admin_key_hash is None:
            admin_key_hash, _ = resolve_admin_key(settings.gateway.admin_key, settings.gateway.admin_key_hash, None)
        self.admin = AdminAuth(admin_key_hash)
        self.metrics_auth = MetricsAuth(self.api_keys, self.admin, settings.gateway.metrics_key)
        self.window = MetricsWindow(window_s=window_s, slos=settings.slos)
        self.prometheus = PrometheusMetrics()
        self.recent: deque[RequestRecord] = deque(maxlen=RECENT_REQUESTS)
        self.counters = GatewayCounters(window_s=window_s)
        self.pipeline = Pipeline(self.replicas, self.models, self.on_finish)
        self.pipeline.retry_budget = retry_budget(settings.gateway)
        self.pipeline.decision_headers = settings.gateway.decision_headers
        # the queue bounds as configured, or as last patched live (gateway.* tunables)
        self.pipeline.admission.limits = lambda: QueueLimits.current(settings.gateway, self.tunable_values)
        self.keys = self._key_service()
        self.engine_telemetry = EngineTelemetry(self.replicas, telemetry_interval_s)
        self.started_at = time.time()
        self.tunable_values: dict[str, Any] = {}
        self.tunables_per_model: dict[str, dict[str, Any]] = {}  # name -> {model: value} where models differ
        self.is_ready = False  # every backend loaded
        #: when a drain's grace ends (time.monotonic()); what is still running then is cancelled
        self.drain_deadline: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_task: asyncio.Task | None = None
        #: gc.freeze() once the models are loaded (tokenops serve sets it; tests building many apps do not)
        self.freezes_heap = False
        #: Why nothing can be served, once every configured model has failed to load (else None);
        #: ``on_nothing_to_serve(cause)`` is then called (tokenops serve stops and exits non-zero).
        self.start_failure: str | None = None
        self.on_nothing_to_serve: Callable[[str], None] | None = None
        #: told how each model's start goes (tokenops serve's progress); ``on_started()`` once it is done
        self.start_report: StartReport | None = None
        self.on_started: Callable[[], None] | None = None

    def _key_service(self) -> Any:
        """Managed keys and spend budgets (:mod:`tokenops.keys`); enforced by the key_budgets plugin."""
        prices = {name: (m.cost_input_per_1m, m.cost_output_per_1m) for name, m in self.models.items()}
        keys = key_service.KeyService.from_settings(
            self.settings,
            self.store,
            prices,
            route=lambda request: hooks.get_route(request, list(self.replicas), self.pipeline.profiles),
        )
        self.api_keys.managed = keys
        per_tenant = self.settings.gateway.metrics_per_tenant
        self.prometheus.sections.append(lambda: keys.prometheus_lines(per_tenant=per_tenant))
        return keys

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """What this gateway owns, in force for the block and the tasks it starts: its plugin set,
        schema budget, span builder, key service and session-memory slot (the edge middleware wraps
        every request)."""
        with (
            self.plugins.activate(),
            in_force(self.schema_budget),
            tracing.exporting(self.tracer),
            contextlib.ExitStack() as stack,
        ):
            stack.callback(key_service.in_use.reset, key_service.in_use.set(self.keys))
            stack.callback(memory_store.slot_in_use.reset, memory_store.slot_in_use.set(self.memory_slot))
            yield

    @property
    def phase(self) -> Phase:
        return self.lifecycle.phase

    @property
    def is_draining(self) -> bool:
        return self.lifecycle.is_draining

    # -- lifecycle --------------------------------------------------------

    def begin(self) -> None:
        """Start the backends in the background: /health answers at once, /ready (and
        requests) once the models are loaded. :meth:`wait_started` awaits it."""
        if self._start_task is None:
            self._loop = asyncio.get_running_loop()
            self.lifecycle.move(Phase.STARTING)
            self.tracer = tracing.configure(self.settings.telemetry.otlp_endpoint, self.settings.telemetry.service_name)
            with self.scope():  # the task (and what it starts) runs with this gateway's plugins
                self._start_task = self._loop.create_task(self.start(), name="tokenops-start-backends")

    async def wait_started(self) -> None:
        if self._start_task is None:
            self.begin()
        assert self._start_task is not None
        await asyncio.shield(self._start_task)

    async def start(self) -> None:
        """Start every backend (in parallel)."""
        self.tunable_values = self._initial_tunables()
        self.engine_telemetry.start()
        await self._start_profiles()
        backends = [r.backend for rs in self.replicas.values() for r in rs]
        results = await start_backends(self.replicas, self.models, self.start_report)
        self._show_running_tunables()
        is_any_up = any(result is None for result in results)
        for backend, result in zip(backends, results):
            if result is not None and is_any_up:  # kept on the backend: /ready lists it, requests get it
                log.error(
                    "model %s failed to load (the other models keep serving): %s",
                    getattr(backend, "name", backend),
                    getattr(backend, "load_error", None),
                )
        if backends and not is_any_up:
            self.start_failure = nothing_to_serve(self.replicas)
            self.lifecycle.move_if_allowed(Phase.FAILED)
            if self.on_nothing_to_serve is not None:
                self.on_nothing_to_serve(self.start_failure)
                return  # the server stops now: nothing below is needed
            log.error("%s", self.start_failure)  # an app embedded elsewhere keeps running: say it in the log
        # what is alive now (weights, modules, tokenizers) lives as long as the server: freezing
        # it keeps full collections, triggered by a request's many small objects, from walking it
        # (a ~0.3 s pause of every request on the demo engine, measured in tests/benchmarks/hostile_load.py)
        if self.freezes_heap:
            gc.collect()
            gc.freeze()
        self.is_ready = all(b.ready for b in backends)
        if not self.start_failure:
            self.lifecycle.move_if_allowed(Phase.SERVING)  # a drain begun meanwhile keeps draining
        if self.on_started is not None and not self.start_failure:
            self.on_started()

    async def _start_profiles(self) -> None:
        """Capability profiles from profiles/models/ and the store, kept current (gateway/core/profile_source.py)."""
        from tokenops.gateway.core.profile_source import ProfileSource

        self.profile_source = ProfileSource.from_settings(self.settings, self.store)
        self.pipeline.profiles = await asyncio.to_thread(self.profile_source.load)
        self.profile_source.start(self.pipeline)

    def begin_drain(self, timeout_s: float | None = None) -> float:
        """Stop taking requests (503 ``shutting_down``; queued ones too) and set the drain's deadline,
        ``timeout_s`` from now (default: ``[gateway] drain_timeout_s``, live). Safe from a signal
        handler; a second call keeps the first deadline. Returns the seconds left until it."""
        if self.drain_deadline is None:
            if timeout_s is None:
                timeout_s = float(
                    self.tunable_values.get("gateway.drain_timeout_s", self.settings.gateway.drain_timeout_s)
                )
            self.drain_deadline = time.monotonic() + timeout_s
            self.lifecycle.move_if_allowed(Phase.DRAINING)
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._start_drain_clock)
        return max(0.0, self.drain_deadline - time.monotonic())

    def _start_drain_clock(self) -> None:
        """On the event loop: queued requests are refused now; running ones are cut at the deadline."""
        assert self.drain_deadline is not None and self._loop is not None
        self.pipeline.admission.close()
        self._loop.call_later(max(0.0, self.drain_deadline - time.monotonic()), self.pipeline.cut)

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Wait for in-flight requests to finish until the drain's deadline (graceful shutdown), then
        cut what still runs (:meth:`Pipeline.cut`; under ``tokenops serve`` uvicorn cancels the streams
        still sending, its ``timeout_graceful_shutdown``) and give their cleanup a short grace."""
        self.begin_drain(timeout_s)
        self.pipeline.admission.close()
        assert self.drain_deadline is not None
        while self.pipeline.num_in_flight > 0 and time.monotonic() < self.drain_deadline:
            await asyncio.sleep(0.05)
        self.pipeline.cut()
        deadline = time.monotonic() + _CANCEL_GRACE_S
        while self.pipeline.num_in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
        await self.engine_telemetry.stop()
        await asyncio.to_thread(tracing.shutdown, self.tracer)  # flushes queued spans, bounded by its timeout
        self.tracer = None
        memory, self.memory_slot.memory = self.memory_slot.memory, None
        if memory is not None and hasattr(memory, "close"):  # Redis session memory: lands its queued writes
            try:
                await asyncio.to_thread(memory.close)
            except Exception as e:
                log.warning("closing the session memory failed: %s", e)
        if getattr(self, "profile_source", None) is not None:
            await self.profile_source.stop()
        for rs in self.replicas.values():
            for r in rs:
                try:
                    await r.backend.close()
                except Exception as e:
                    log.warning("closing %s failed: %s", r.name, e)
        self.lifecycle.move(Phase.STOPPED)

    # -- per request ------------------------------------------------------

    def on_finish(self, rec: RequestRecord) -> None:
        """Called by the pipeline once per request, whatever its outcome."""
        self.window.add(rec)
        self.prometheus.observe(rec)
        self.recent.append(rec)
        self.counters.add(rec)
        hooks.request_finished(rec)
        hooks.record(TelemetryEvent("requests", rec.row(), ts=rec.arrival))

    # -- views ------------------------------------------------------------

    def engine_stats(self) -> dict[str, dict[str, Any]]:
        """Replica name -> live ``stats()`` (the last sample when a call fails)."""
        out = {}
        for rs in self.replicas.values():
            for r in rs:
                try:
                    stats = r.backend.stats()
                except Exception:
                    stats = self.engine_telemetry.latest.get(r.name)
                if stats:
                    out[r.name] = stats
                    plan = self.expert_plans.plan_for(r.name, stats.get("expert_load"))
                    if plan is not None:
                        out[r.name] = {**stats, "eplb": plan}
        return out

    def stats(self) -> dict[str, Any]:
        """The ``GET /admin/stats`` document."""
        now = time.time()
        snap = self.window.snapshot(in_flight=self.pipeline.num_in_flight, now=now)
        counts = self.counters.snapshot()
        models = self.counters.model_rows(counts, list(self.replicas))
        if self.model_swap is not None:  # which bundled-engine models are resident ([gateway] max_loaded_models)
            for name, is_resident in model_swap.resident_models(self.model_swap, self.replicas).items():
                models.setdefault(name, {})["resident"] = is_resident
        history = snap.pop("history")
        return {
            "time": now,
            "uptime_s": now - self.started_at,
            **snap,
            "engines": self.engine_stats(),
            "models": models,
            "phase": self.lifecycle.phase.value,
            "routes": counts.routes,
            "cache": {"lookups": counts.cache.num_lookups, "hits": counts.cache.num_hits},
            "escalations": counts.num_escalations,
            "spend": self.keys.dashboard_rows(),
            "breakers": replica_states(self.replicas),
            "admission": self.pipeline.admission.stats(),  # per model: running, waiting, rejected, slots
            "model_swap": self.model_swap.stats() if self.model_swap is not None else None,
            "history": history,
        }

    def _show_running_tunables(self) -> None:
        """Tunables as the started engines run them (``[plugins.*]`` tables and per-model ``engine``
        included), not the registry's defaults; where models differ, ``tunables_per_model`` says how."""
        from tokenops.plugin_manager import get_tunables, hook

        names = {t.name for t in get_tunables()}
        per_model: dict[str, dict[str, Any]] = {}
        for model, replicas in self.replicas.items():
            configs = (getattr(r.backend, "config", None) for r in replicas if getattr(r.backend, "ready", False))
            config = next((c for c in configs if c is not None), None)
            if config is None:  # not a bundled engine, or it failed to load
                continue
            values = {
                n: getattr(config, n[len("engine.") :])
                for n in names
                if n.startswith("engine.") and hasattr(config, n[len("engine.") :])
            }
            for part in hook().tokenops_tunable_values(config=config):
                values.update({k: v for k, v in (part or {}).items() if k in names})
            for name, value in values.items():
                per_model.setdefault(name, {})[model] = value
        self.tunables_per_model = {n: v for n, v in per_model.items() if len({repr(x) for x in v.values()}) > 1}
        self.tunable_values.update({n: next(iter(v.values())) for n, v in per_model.items()})

    def _initial_tunables(self) -> dict[str, Any]:
        from tokenops.plugin_manager import get_tunables

        values = {}
        for t in get_tunables():
            value = t.default
            if t.name.startswith("engine.") and hasattr(self.settings.engine, t.name[len("engine.") :]):
                configured = getattr(self.settings.engine, t.name[len("engine.") :])
                if configured is not None:
                    value = configured
            elif t.name.startswith("gateway.") and hasattr(self.settings.gateway, t.name[len("gateway.") :]):
                value = getattr(self.settings.gateway, t.name[len("gateway.") :])
            elif t.name.startswith("batches.") and hasattr(self.settings.batches, t.name[len("batches.") :]):
                value = getattr(self.settings.batches, t.name[len("batches.") :])
            values[t.name] = value
        return values
