"""Circuit breaking, outlier ejection, health probes and degradation to a smaller model.

On by default for models with two or more replicas (a dead replica then costs
no client errors while a healthy one is left: LiteLLM's router cools deployments
down by default too); ``[plugins.circuit_breaker]`` turns it on for single-replica
models as well (whose only use is ``degrade_to``), ``enabled = false`` turns it
off, and so does the ``breaker.enabled`` tunable. Settings: the :class:`~tokenops.resilience.breaker.BreakerConfig`
fields, ``outlier = true`` (+ ``outlier_factor``, ``outlier_ejection_s``),
``health_probe_interval_s`` (> 0 polls ``/health`` of HTTP replicas),
``degrade_to = { "big-model" = "small-model" }`` and ``overload_in_flight``.

Selection: wraps ``tokenops_select_replica`` so every selector only sees replicas
whose breaker lets calls through; when none does it passes (None). Routing: wraps
``tokenops_route`` so a model whose replicas are all open (or all have
``overload_in_flight`` calls running) is replaced by its ``degrade_to`` model;
``tokenops_fallback`` names the same model after a failed call. Retries with
jittered backoff stay with the gateway.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tokenops import hookimpl
from tokenops.resilience.breaker import BreakerConfig
from tokenops.resilience.health import CLIENT_ERRORS, HealthProber, ReplicaHealth
from tokenops.resilience.outlier import OutlierConfig
from tokenops.tunables import Tunable, TunableError

TOKENOPS_LAYER = "compute_network"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {
    "circuit_breaker": (
        "enabled",
        "outlier",
        "degrade_to",
        "health_probe_interval_s",
        "overload_in_flight",
        *(f.name for f in dataclasses.fields(BreakerConfig)),
        *(f"outlier_{f.name}" for f in dataclasses.fields(OutlierConfig)),
    )
}

_TUNABLES = {
    "breaker.failure_rate": "failure_rate",
    "breaker.consecutive_failures": "consecutive_failures",
    "breaker.cooldown_s": "cooldown_s",
    "breaker.window_s": "window_s",
}


class BreakerPlugin:
    """One gateway's circuit breakers: its health board, prober, degradation map and the
    replicas it watches (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.health: ReplicaHealth | None = None
        self.prober: HealthProber | None = None
        self.degrade_to: dict[str, str] = {}
        self.overload_in_flight: int | None = None
        #: Breakers also filter single-replica models (only when configured explicitly).
        self.every_model = False
        #: Replicas of multi-replica models (the ones breakers watch by default).
        self.watched: set[str] = set()

    def configure(
        self,
        breaker: BreakerConfig | None = None,
        outlier: OutlierConfig | None = None,
        degrade: dict[str, str] | None = None,
        probe_interval_s: float = 0.0,
        max_in_flight: int | None = None,
        all_models: bool = True,
        **kw,
    ) -> ReplicaHealth:
        """Install the breaker (tests pass a clock); returns the health board. ``all_models=False``
        leaves models with one replica unfiltered (the default deployment)."""
        if self.prober is not None:
            self.prober.stop()
        self.health = ReplicaHealth(breaker or BreakerConfig(), outlier, **kw)
        # always: half-open trials of HTTP replicas are background probes; routine probes only when asked
        self.prober = HealthProber(self.health, probe_interval_s)
        self.degrade_to = dict(degrade or {})
        self.overload_in_flight = max_in_flight
        self.every_model = all_models
        self.watched.clear()
        return self.health

    def disable(self) -> None:
        if self.prober is not None:
            self.prober.stop()
        self.health = self.prober = None

    @hookimpl
    def tokenops_register_decisions(self, register):
        from tokenops.types import Hop

        register("breaker", dict[str, Any])  # {"excluded": [replicas an open breaker kept out]}
        register("degraded", Hop)  # sent to a smaller model while the asked one is down

    @hookimpl
    def tokenops_configure(self, settings):
        raw = dict(settings.plugin_settings("circuit_breaker"))
        if not raw:
            if self.health is None:  # the default: breakers for multi-replica models (a board set up already stays)
                self.configure(all_models=False)
            return
        if not raw.pop("enabled", True):
            self.disable()
            return
        outlier = None
        if raw.pop("outlier", False):
            outlier = OutlierConfig(
                **{k.removeprefix("outlier_"): raw.pop(k) for k in list(raw) if k.startswith("outlier_")}
            )
        try:
            self.configure(
                BreakerConfig(**{k: raw.pop(k) for k in list(raw) if k in BreakerConfig.__slots__}),
                outlier,
                degrade=raw.pop("degrade_to", {}),
                probe_interval_s=float(raw.pop("health_probe_interval_s", 0)),
                max_in_flight=raw.pop("overload_in_flight", None),
            )
            if raw:
                raise ValueError(f"unknown key(s) {', '.join(sorted(raw))}")
        except (TypeError, ValueError) as e:
            from tokenops.config import ConfigError

            raise ConfigError(f"[plugins.circuit_breaker]: {e}") from None

    @hookimpl
    def tokenops_register_tunables(self, register):
        register_tunables(register)

    @hookimpl
    def tokenops_apply_tunables(self, values):
        mine = {k: v for k, v in values.items() if k.startswith("breaker.")}
        if not mine:
            return
        if mine.get("breaker.enabled") is False:
            self.disable()
            return
        base = self.health.breaker_config if self.health is not None else BreakerConfig()
        try:
            config = dataclasses.replace(base, **{_TUNABLES[k]: v for k, v in mine.items() if k in _TUNABLES})
        except (TypeError, ValueError) as e:
            raise TunableError(str(e)) from None
        if config.max_cooldown_s < config.cooldown_s:
            config.max_cooldown_s = config.cooldown_s
        if self.health is None:
            if mine.get("breaker.enabled"):
                self.configure(config, degrade=self.degrade_to)
            return
        self.health.set_breaker_config(config)

    @hookimpl(wrapper=True)
    def tokenops_select_replica(self, request, replicas):
        health = self.health
        if health is None or (len(replicas) < 2 and not self.every_model):
            return (yield)
        self.watched.update(r.name for r in replicas)
        if self.prober is not None:
            self.prober.watch(replicas)
        allowed = health.available(replicas)
        if len(allowed) == len(replicas):
            chosen = yield
        else:
            excluded = [r.name for r in replicas if r not in allowed]
            request.decide("breaker", {"excluded": excluded})
            original = list(replicas)
            replicas[:] = allowed  # the selectors below see only replicas that may be called
            try:
                chosen = yield
            finally:
                replicas[:] = original
        if chosen is not None:
            health.on_selected(chosen.name)
        return chosen

    @hookimpl(wrapper=True)
    def tokenops_route(self, request, candidates, profiles):
        decision = yield
        health = self.health
        if health is None or decision is None or not self.degrade_to:
            return decision
        target = self.degrade_to.get(decision.model)
        if not target or target not in candidates or health.is_model_down(target):
            return decision
        why = None
        if health.is_model_down(decision.model):
            why = "replicas_open"
        elif self.overload_in_flight and health.is_model_overloaded(decision.model, self.overload_in_flight):
            why = "overloaded"
        if why is None:
            return decision
        request.decide("degraded", {"from": decision.model, "to": target, "reason": why})
        return dataclasses.replace(decision, model=target, reason=f"degraded:{why}")

    @hookimpl(tryfirst=True)
    def tokenops_fallback(self, request, error):
        if self.health is None or getattr(error, "kind", None) in CLIENT_ERRORS:
            return None
        failed = request.attempts[-1] if request.attempts else request.model
        target = self.degrade_to.get(failed)
        if target and target not in request.attempts:
            request.decide("degraded", {"from": failed, "to": target, "reason": getattr(error, "kind", "error")})
            return target
        return None

    @hookimpl
    def tokenops_replica_states(self):
        return self.health.states() if self.health is not None else None

    @hookimpl
    def tokenops_backend_outcome(self, backend, outcome):
        if self.health is not None and (self.every_model or backend in self.watched):
            self.health.record(backend, outcome)


def register_tunables(register) -> None:
    register(
        Tunable(
            "breaker.enabled",
            "bool",
            True,
            "Stop sending traffic to failing replicas (models with 2+ "
            "replicas; every model when [plugins.circuit_breaker] is configured).",
            live=True,
            searchable=False,
        )
    )
    register(
        Tunable(
            "breaker.failure_rate",
            "float",
            0.5,
            "Failure rate in the window that opens a breaker.",
            live=True,
            minimum=0.05,
            maximum=1.0,
            searchable=False,
        )
    )
    register(
        Tunable(
            "breaker.consecutive_failures",
            "int",
            3,
            "Failures in a row that open a breaker at once.",
            live=True,
            minimum=1,
            maximum=1000,
            searchable=False,
        )
    )
    register(
        Tunable(
            "breaker.cooldown_s",
            "float",
            5.0,
            "Seconds an open breaker waits before trial calls.",
            live=True,
            minimum=0.1,
            maximum=3600.0,
            searchable=False,
        )
    )
    register(
        Tunable(
            "breaker.window_s",
            "float",
            10.0,
            "Sliding window of the failure rate, seconds.",
            live=True,
            minimum=1.0,
            maximum=3600.0,
            searchable=False,
        )
    )
