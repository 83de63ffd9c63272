"""``Gateway``: everything one running server holds — replicas, pipeline, auth,
metrics, recent requests, current tunable values — and its start/stop."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
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
from tokenops.gateway.edge import schema_budget
from tokenops.gateway.observability import tracing
from tokenops.gateway.observability.expert_plans import ExpertPlans
from tokenops.gateway.observability.metrics_auth import MetricsAuth
from tokenops.gateway.observability.metrics_window import MetricsWindow
from tokenops.gateway.observability.prometheus import PrometheusMetrics
from tokenops.gateway.observability.records import RequestRecord
from tokenops.gateway.observability.replica_health import replica_states
from tokenops.gateway.observability.telemetry import EngineTelemetry
from tokenops.routing.retry import retry_budget
from tokenops.types import TelemetryEvent

log = logging.getLogger("tokenops.gateway")

RECENT_REQUESTS = 1000
#: After the drain deadline: how long cancelled requests get to abort and finish their records.
_CANCEL_GRACE_S = 2.0


class Gateway:
    """The state behind one FastAPI app (``app.state.gateway``)."""

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
        schema_budget.configure(schema_budget.SchemaBudget.from_settings(settings.gateway))
        # plugins first: they adjust engine configs, which are checked as the replicas are built
        try:
            hooks.configure(settings)
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
        self.pipeline = Pipeline(self.replicas, self.models, self.on_finish)
        self.pipeline.retry_budget = retry_budget(settings.gateway)
        self.pipeline.decision_headers = settings.gateway.decision_headers
        # the queue bounds as configured, or as last patched live (gateway.* tunables)
        self.pipeline.admission.limits = lambda: QueueLimits.current(settings.gateway, self.tunable_values)
        self.keys = self._key_service()
        self.engine_telemetry = EngineTelemetry(self.replicas, telemetry_interval_s)
        self.started_at = time.time()
        self.routes: dict[str, int] = {}
        self.cache = {"lookups": 0, "hits": 0}
        self.num_escalations = 0
        self.per_model: dict[str, dict[str, float]] = {}
        self._model_costs: deque[tuple[float, str, float]] = deque()
        self.tunable_values: dict[str, Any] = {}
        self.tunables_per_model: dict[str, dict[str, Any]] = {}  # name -> {model: value} where models differ
        self.is_ready = False
        self.is_draining = False
        #: when a drain's grace ends (time.monotonic()); what is still running then is cancelled
        self.drain_deadline: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # on_finish (event loop) vs stats() (admin thread)
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
        from tokenops.keys import service

        prices = {name: (m.cost_input_per_1m, m.cost_output_per_1m) for name, m in self.models.items()}
        keys = service.KeyService.from_settings(
            self.settings,
            self.store,
            prices,
            route=lambda request: hooks.get_route(request, list(self.replicas), self.pipeline.profiles),
        )
        self.api_keys.managed = keys
        per_tenant = self.settings.gateway.metrics_per_tenant
        self.prometheus.sections.append(lambda: keys.prometheus_lines(per_tenant=per_tenant))
        service.active = keys
        return keys

    # -- lifecycle --------------------------------------------------------

    def begin(self) -> None:
        """Start the backends in the background: /health answers at once, /ready (and
        requests) once the models are loaded. :meth:`wait_started` awaits it."""
        if self._start_task is None:
            self._loop = asyncio.get_running_loop()
            tracing.configure(self.settings.telemetry.otlp_endpoint, self.settings.telemetry.service_name)
            self._start_task = asyncio.get_running_loop().create_task(self.start(), name="tokenops-start-backends")

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
                    backend.load_error,
                )
        if backends and not is_any_up:
            self.start_failure = nothing_to_serve(self.replicas)
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
            self.is_draining = True
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
        await asyncio.to_thread(tracing.shutdown)  # flushes queued spans, bounded by the exporter's timeout
        if getattr(self, "profile_source", None) is not None:
            await self.profile_source.stop()
        for rs in self.replicas.values():
            for r in rs:
                try:
                    await r.backend.close()
                except Exception as e:
                    log.warning("closing %s failed: %s", r.name, e)

    # -- per request ------------------------------------------------------

    def on_finish(self, rec: RequestRecord) -> None:
        """Called by the pipeline once per request, whatever its outcome."""
        self.window.add(rec)
        self.prometheus.observe(rec)
        self.recent.append(rec)
        with self._lock:
            self._count(rec)
        hooks.request_finished(rec)
        hooks.record(TelemetryEvent("requests", rec.row(), ts=rec.arrival))

    def _count(self, rec: RequestRecord) -> None:
        if rec.route_reason:
            self.routes[rec.route_reason] = self.routes.get(rec.route_reason, 0) + 1
        if "cache" in rec.decisions:
            self.cache["lookups"] += 1
            self.cache["hits"] += 1 if rec.is_cache_hit else 0
        self.num_escalations += 1 if rec.is_escalated else 0
        model = rec.model_served or rec.model_requested
        m = self.per_model.setdefault(
            model,
            {
                "requests": 0,
                "errors": 0,
                "rejected": 0,
                "disconnected": 0,
                "input_tokens": 0,
                "output_tokens": 0,
                "cost_usd": 0.0,
            },
        )
        m["requests"] += 1
        outcome = rec.outcome  # one definition of an error everywhere (RequestRecord.outcome)
        if outcome != "ok":
            m[outcome + "s" if outcome == "error" else outcome] += 1
        m["input_tokens"] += rec.tokens_in
        m["output_tokens"] += rec.tokens_out
        if rec.reasoning_tokens is not None:  # reasoning models: the share of output spent thinking
            m["reasoning_tokens"] = m.get("reasoning_tokens", 0) + rec.reasoning_tokens
        m["cost_usd"] += rec.cost_usd
        now = time.time()
        self._model_costs.append((now, model, rec.cost_usd))
        while self._model_costs and self._model_costs[0][0] < now - self.window.window_s:
            self._model_costs.popleft()

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
        with self._lock:
            per_model = {k: dict(v) for k, v in self.per_model.items()}
            costs = list(self._model_costs)
            routes, cache, num_escalations = dict(self.routes), dict(self.cache), self.num_escalations
        total = sum(m["requests"] for m in per_model.values()) or 1
        hourly: dict[str, float] = {}
        for _, model, cost in costs:
            hourly[model] = hourly.get(model, 0.0) + cost
        models = {}
        for name in sorted(set(self.replicas) | set(per_model)):
            m = per_model.get(
                name, {"requests": 0, "errors": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
            )
            models[name] = {
                "requests": int(m["requests"]),
                "errors": int(m["errors"]),
                "rejected": int(m.get("rejected", 0)),
                "disconnected": int(m.get("disconnected", 0)),
                "error_rate": m["errors"] / m["requests"] if m["requests"] else 0.0,
                "input_tokens": int(m["input_tokens"]),
                "output_tokens": int(m["output_tokens"]),
                "cost_usd": m["cost_usd"],
                "share": m["requests"] / total,
                "reasoning_tokens": m.get("reasoning_tokens"),
                "cost_per_hour_usd": hourly.get(name, 0.0) * 3600.0 / self.window.window_s,
            }
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
            "routes": routes,
            "cache": cache,
            "escalations": num_escalations,
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
            config = next(
                (
                    r.backend.config
                    for r in replicas
                    if getattr(r.backend, "config", None) is not None and getattr(r.backend, "ready", False)
                ),
                None,
            )
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
            values[t.name] = value
        return values
