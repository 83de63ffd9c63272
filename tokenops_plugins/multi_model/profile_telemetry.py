"""Running capability profiles: per served model, exponential moving averages of the
error rate, end-to-end latency and validator pass rate, fed by request telemetry.

The profile router reads them (``running_stats``) and skips a model whose running
error rate is above ``[plugins.router.profile] max_error_rate`` (default 0.2), so a
model that starts failing stops receiving routed traffic until it recovers.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from tokenops import hookimpl

from ._profiling import update_from_telemetry

TOKENOPS_LAYER = "multi_model"
VALIDATOR_PASS = 0.5


def running_stats(model: str) -> dict[str, float]:
    """``model``'s running stats as the running gateway's instance has them (the process's outside
    one); empty when the plugin is not loaded."""
    plugin = _instance()
    return plugin.running_stats(model) if plugin is not None else {}


def reset() -> None:
    """Forget the running stats of the running gateway's instance (the process's outside one)."""
    plugin = _instance()
    if plugin is not None:
        plugin.reset()


def _instance() -> ProfileTelemetry | None:
    from tokenops.plugin_manager import get_plugin

    plugin = get_plugin("profile_telemetry")
    return plugin if isinstance(plugin, ProfileTelemetry) else None


class ProfileTelemetry:
    """One gateway's running profiles (each gateway has its own instance: it learns from its own traffic)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER

    def __init__(self) -> None:
        self._running: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def running_stats(self, model: str) -> dict[str, float]:
        with self._lock:
            return dict(self._running.get(model, {}).get("running", {}))

    def reset(self) -> None:
        with self._lock:
            self._running.clear()

    @hookimpl
    def tokenops_record(self, event):
        if event.kind != "requests":
            return
        rows = event.data if isinstance(event.data, list) else [event.data]
        for row in rows:
            model = row.get("model_served")
            if not model or row.get("cache_hit"):
                continue
            decisions = row.get("decisions") or {}
            if isinstance(decisions, str):
                decisions = json.loads(decisions)
            score = decisions.get("validate")
            passed = None if score is None else float(score >= VALIDATOR_PASS)
            with self._lock:
                self._running[model] = update_from_telemetry(
                    self._running.get(model, {}), float(row.get("status") == "error"), row.get("e2e_s"), passed
                )
