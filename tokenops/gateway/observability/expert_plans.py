"""EPLB plans of the MoE replicas, computed when their expert load changes rather than on
every ``/metrics`` scrape or ``/admin/stats`` poll (a plan is a placement search)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tokenops.gateway.core import hooks


class ExpertPlans:
    """Replica name -> the EPLB plan summary of its latest expert load.

    A plan is recomputed only when the replica's load differs from the one it was computed
    for, and then at most once per ``plan_interval_s`` (under traffic the counters move on
    every step; between recomputes the last plan is served). ``[plugins.eplb]`` is read
    once, here (see :data:`DEFAULTS`). Each plan carries ``computed_at`` (unix time).
    """

    #: ``[plugins.eplb]`` keys: devices and redundant slots to plan for, nodes (hierarchical
    #: placement when > 1), and the shortest time between two plans of one replica.
    DEFAULTS = {"devices": 4, "redundant": 4, "nodes": 1, "plan_interval_s": 5.0}

    def __init__(self, eplb_settings: dict[str, Any], clock: Callable[[], float] = time.monotonic) -> None:
        unknown = sorted(set(eplb_settings) - set(self.DEFAULTS))
        if unknown:
            raise ValueError(f"[plugins.eplb] unknown key(s) {', '.join(unknown)}; allowed: {', '.join(self.DEFAULTS)}")
        conf = {**self.DEFAULTS, **eplb_settings}
        try:
            self.num_devices, self.num_redundant, self.num_nodes = (
                int(conf[k]) for k in ("devices", "redundant", "nodes")
            )
            self.min_interval_s = float(conf["plan_interval_s"])
        except (TypeError, ValueError):
            raise ValueError(
                f"[plugins.eplb] devices, redundant and nodes must be integers and plan_interval_s "
                f"a number of seconds, not {eplb_settings}"
            ) from None
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
            plan = hooks.get_expert_plan(
                [[float(x) for x in row] for row in load if any(row)],
                self.num_devices,
                self.num_redundant,
                self.num_nodes,
            )
        except ValueError:  # the expert count does not fit the configured devices
            return None
        if plan is None:
            return None
        return {**(plan.summary() if hasattr(plan, "summary") else plan), "computed_at": time.time()}
