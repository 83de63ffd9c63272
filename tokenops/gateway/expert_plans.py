"""EPLB plans of the MoE replicas, computed when their expert load changes rather than on
every ``/metrics`` scrape or ``/admin/stats`` poll (a plan is a placement search)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from tokenops.gateway import hooks


class ExpertPlans:
    """Replica name -> the EPLB plan summary of its latest expert load.

    A plan is recomputed only when the replica's load differs from the one it was computed
    for, and then at most once per ``min_interval_s`` (under traffic the counters move on
    every step; between recomputes the last plan is served). ``[plugins.eplb]`` (devices,
    redundant, nodes; defaults 4, 4, 1) is read once, here.
    """

    def __init__(self, eplb_settings: dict[str, Any], min_interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.num_devices = int(eplb_settings.get("devices", 4))
        self.num_redundant = int(eplb_settings.get("redundant", 4))
        self.num_nodes = int(eplb_settings.get("nodes", 1))
        self.min_interval_s = min_interval_s
        self.num_computed = 0
        self._clock = clock
        self._lock = threading.Lock()  # /metrics (event loop) and /admin/stats (threads) both read
        self._plans: dict[str, tuple[tuple, float, dict[str, Any] | None]] = {}

    def plan_for(self, replica: str, load: Any) -> dict[str, Any] | None:
        """The plan summary for ``replica``'s ``load`` (None: no MoE load, or no plan fits)."""
        if not load or not any(any(row) for row in load):
            return None
        key = tuple(tuple(row) for row in load)
        now = self._clock()
        with self._lock:
            cached = self._plans.get(replica)
            if cached is not None and (cached[0] == key or now - cached[1] < self.min_interval_s):
                return cached[2]
            plan = self._compute(load)
            self._plans[replica] = (key, now, plan)
            return plan

    def _compute(self, load: Any) -> dict[str, Any] | None:
        self.num_computed += 1
        try:
            plan = hooks.get_expert_plan([[float(x) for x in row] for row in load if any(row)],
                                         self.num_devices, self.num_redundant, self.num_nodes)
        except ValueError:  # the expert count does not fit the configured devices
            return None
        if plan is None:
            return None
        return plan.summary() if hasattr(plan, "summary") else plan
