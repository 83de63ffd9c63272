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

_running: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()


def running_stats(model: str) -> dict[str, float]:
    with _lock:
        return dict(_running.get(model, {}).get("running", {}))


def reset() -> None:
    with _lock:
        _running.clear()


@hookimpl
def tokenops_record(event):
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
        with _lock:
            _running[model] = update_from_telemetry(
                _running.get(model, {}), float(row.get("status") == "error"), row.get("e2e_s"), passed
            )
