"""Per-replica health: a circuit breaker each, latency-outlier ejection, and what
the gateway's replica selection and fallback need to ask of them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tokenops.resilience.breaker import HALF_OPEN, OPEN, BreakerConfig, CircuitBreaker
from tokenops.resilience.outlier import OutlierConfig, OutlierDetector

#: Errors that say the request was bad, not the replica: they count as the replica answering.
CLIENT_ERRORS = frozenset({"bad_request", "context_length"})


class ReplicaHealth:
    def __init__(
        self,
        breaker: BreakerConfig | None = None,
        outlier: OutlierConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.breaker_config = breaker or BreakerConfig()
        self.clock = clock
        self.outliers = OutlierDetector(outlier, clock) if outlier is not None else None
        self._breakers: dict[str, CircuitBreaker] = {}
        self._models: dict[str, set[str]] = {}  # model -> replica names seen
        self._replicas: dict[str, list[Any]] = {}  # model -> the replica objects last offered
        #: replicas whose half-open trials a background prober makes (client requests never do)
        self.probed: set[str] = set()
        self._lock = threading.Lock()

    def set_breaker_config(self, config: BreakerConfig) -> None:
        """Use ``config`` for every breaker, the existing ones included (a live tunable change)."""
        with self._lock:
            self.breaker_config = config
            for b in self._breakers.values():
                b.config = config

    def breaker(self, name: str) -> CircuitBreaker:
        with self._lock:
            b = self._breakers.get(name)
            if b is None:
                b = self._breakers[name] = CircuitBreaker(self.breaker_config, self.clock)
            return b

    def is_available(self, name: str) -> bool:
        breaker = self.breaker(name)
        if not breaker.can_call():
            return False
        if name in self.probed and breaker.current_state() == HALF_OPEN:
            return False  # recovering: the prober's trial calls decide, not a client's request
        return self.outliers is None or not self.outliers.is_ejected(name)

    def available(self, replicas: list[Any]) -> list[Any]:
        """The replicas a call may go to; remembers which model each belongs to."""
        for r in replicas:
            model = getattr(r, "model", None)
            if model is not None:
                self._models.setdefault(model, set()).add(r.name)
        if replicas and getattr(replicas[0], "model", None) is not None:
            self._replicas[replicas[0].model] = list(replicas)
        return [r for r in replicas if self.is_available(r.name)]

    def on_selected(self, name: str) -> None:
        self.breaker(name).on_call()

    def record(self, name: str, outcome: Any) -> None:
        is_ok = bool(outcome.ok) or outcome.error_kind in CLIENT_ERRORS
        self.breaker(name).record(is_ok)
        if outcome.ok and self.outliers is not None:
            self.outliers.record(name, outcome.latency_s, outcome.completion_tokens)

    def is_model_down(self, model: str) -> bool:
        """Every known replica of ``model`` is open or ejected (False for an unknown model)."""
        names = self._models.get(model)
        if not names:
            return False
        return not any(self.is_available(n) for n in names)

    def is_model_overloaded(self, model: str, max_in_flight: int) -> bool:
        """Every replica of ``model`` has at least ``max_in_flight`` calls running
        (the gateway's ``Replica.in_flight``)."""
        replicas = self._replicas.get(model)
        if not replicas:
            return False
        return all(getattr(r, "in_flight", 0) >= max_in_flight for r in replicas)

    def states(self) -> dict[str, str]:
        out = {}
        for name in list(self._breakers):
            state = self._breakers[name].current_state()
            if state != OPEN and self.outliers is not None and self.outliers.is_ejected(name):
                state = "ejected"
            out[name] = state
        return out


class HealthProber:
    """Polls ``GET /health`` of HTTP replicas in a daemon thread.

    Every ``interval_s`` (0: never) it probes every replica: a failed probe opens the
    replica's breaker at once, so traffic leaves before a request has to fail. Every
    ``recovery_interval_s`` it makes the trial calls of half-open breakers itself, so
    recovering a replica never spends client requests (they go to healthy replicas).
    """

    def __init__(
        self, health: ReplicaHealth, interval_s: float = 5.0, timeout_s: float = 2.0, recovery_interval_s: float = 0.5
    ) -> None:
        assert interval_s >= 0 and timeout_s > 0 and recovery_interval_s > 0
        self.health = health
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.recovery_interval_s = recovery_interval_s
        self.targets: dict[str, str] = {}  # replica name -> health URL
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def health_url(backend: Any) -> str | None:
        url = getattr(backend, "url", None)
        if not isinstance(url, str) or not url.startswith("http"):
            return None
        return url.rstrip("/").removesuffix("/v1") + "/health"

    def watch(self, replicas: list[Any]) -> None:
        for r in replicas:
            if r.name not in self.targets:
                url = self.health_url(getattr(r, "backend", None))
                if url:
                    self.targets[r.name] = url
                    self.health.probed.add(r.name)
        if self.targets and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tokenops-health-probe", daemon=True)
            self._thread.start()

    def _probe(self, url: str) -> bool:
        import httpx

        try:
            return httpx.get(url, timeout=self.timeout_s).status_code < 500
        except httpx.HTTPError:
            return False

    def probe_once(self) -> dict[str, bool]:
        results = {}
        for name, url in list(self.targets.items()):
            ok = results[name] = self._probe(url)
            if not ok:
                self.health.breaker(name).force_open()
        return results

    def probe_recovering(self) -> dict[str, str]:
        """Trial calls for every half-open breaker; returns their states afterwards."""
        out = {}
        for name, url in list(self.targets.items()):
            breaker = self.health.breaker(name)
            while breaker.current_state() == HALF_OPEN:
                breaker.on_call()
                breaker.record(self._probe(url))
            out[name] = breaker.current_state()
        return out

    def _run(self) -> None:
        import time

        next_full = time.monotonic() + self.interval_s
        while not self._stop.wait(self.recovery_interval_s):
            self.probe_recovering()
            if self.interval_s > 0 and time.monotonic() >= next_full:
                self.probe_once()
                next_full = time.monotonic() + self.interval_s

    def stop(self) -> None:
        self._stop.set()
