"""Periodic engine telemetry: one ``engine_stats`` row per replica every second and,
for MoE models, ``expert_load`` rows holding the tokens routed per expert since
the previous tick (the engine's counters are cumulative)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tokenops.backends.base import Replica
from tokenops.gateway.core import hooks
from tokenops.types import TelemetryEvent

log = logging.getLogger("tokenops.gateway")


def engine_stats_row(replica: Replica, stats: dict[str, Any], ts: float) -> dict[str, Any]:
    spec = stats.get("spec_decode") or {}
    return {
        "ts": ts,
        "replica": replica.name,
        "model": replica.model,
        "num_running": stats.get("num_running"),
        "num_waiting": stats.get("num_waiting"),
        "kv_cache_usage": stats.get("kv_cache_usage"),
        "kv_blocks_used": stats.get("kv_blocks_used"),
        "kv_blocks_total": stats.get("kv_blocks_total"),
        "prefix_cache_queries": stats.get("prefix_cache_queries"),
        "prefix_cache_hits": stats.get("prefix_cache_hits"),
        "num_preemptions": stats.get("num_preemptions"),
        "batch_tokens": stats.get("last_batch_tokens"),
        "step_time_s": stats.get("last_step_time_s"),
        "gen_tokens_total": stats.get("total_generation_tokens"),
        "prompt_tokens_total": stats.get("total_prompt_tokens"),
        "spec_acceptance": spec.get("acceptance_rate") if isinstance(spec, dict) else None,
    }


class EngineTelemetry:
    """Samples every replica's ``stats()`` once per ``interval_s`` and records it."""

    def __init__(self, replicas: dict[str, list[Replica]], interval_s: float = 1.0) -> None:
        self.replicas = replicas
        self.interval_s = interval_s
        self.latest: dict[str, dict[str, Any]] = {}  # replica name -> last stats
        self._last_load: dict[str, list[list[int]]] = {}
        self._task: asyncio.Task | None = None

    def sample(self, now: float | None = None) -> None:
        """Take one sample of every replica and record it (also called at shutdown)."""
        now = time.time() if now is None else now
        rows, loads = [], []
        for replicas in self.replicas.values():
            for replica in replicas:
                try:
                    stats = replica.backend.stats()
                except Exception as e:  # a replica that cannot report must not stop the others
                    log.warning("stats() of %s failed: %s", replica.name, e)
                    continue
                if not stats:
                    continue
                self.latest[replica.name] = stats
                rows.append(engine_stats_row(replica, stats, now))
                loads += self._expert_rows(replica, stats.get("expert_load"), now)
        if rows:
            hooks.record(TelemetryEvent("engine_stats", rows, ts=now))
        if loads:
            hooks.record(TelemetryEvent("expert_load", loads, ts=now))

    def _expert_rows(self, replica: Replica, load: Any, now: float) -> list[dict[str, Any]]:
        if not load:
            return []
        previous = self._last_load.get(replica.name)
        self._last_load[replica.name] = [list(layer) for layer in load]
        rows = []
        for layer, counts in enumerate(load):
            for expert, total in enumerate(counts):
                before = 0
                if previous is not None and layer < len(previous) and expert < len(previous[layer]):
                    before = previous[layer][expert]
                delta = total - before if total >= before else total  # counters reset: count anew
                if delta:
                    rows.append(
                        {
                            "ts": now,
                            "model": replica.model,
                            "replica": replica.name,
                            "layer": layer,
                            "expert": expert,
                            "tokens": int(delta),
                        }
                    )
        return rows

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tokenops-engine-telemetry")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await asyncio.to_thread(self.sample)
            except Exception as e:
                log.warning("engine telemetry failed: %s", e)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.sample()
