"""A deterministic in-memory implementation of the admin API contract for fast dashboard tests.

It validates PATCHes with the real :class:`tokenops.tunables.Tunable` rules, refuses
restart-only tunables like the gateway does, and records ``config_changes``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tokenops.tui.client import AdminError, ServerUnreachable
from tokenops.tunables import Tunable, TunableError

TUNABLES = (
    Tunable("engine.max_num_seqs", "int", 32, "Most sequences in one batch.", live=True, minimum=1, maximum=512, log=True),
    Tunable("engine.max_num_batched_tokens", "int", 512, "Token budget of one engine step.", live=True, minimum=16, maximum=16384, log=True),
    Tunable("engine.schedule_policy", "str", "fcfs", "Order of the waiting queue.", live=True, choices=("fcfs", "priority")),
    Tunable("engine.enable_prefix_caching", "bool", True, "Reuse KV blocks of shared prefixes.", live=True),
    Tunable("engine.kv_cache_tokens", "int", 16384, "KV cache capacity in tokens.", live=False, minimum=256, maximum=1 << 22),
    Tunable("gateway.rate_limit_rps", "float", 50.0, "Per-tenant request rate limit.", live=True, minimum=0.1, maximum=10000.0),
)

T0 = 1_763_700_000.0


def _wave(i: int, base: float, amp: float, period: float) -> float:
    return round(base + amp * math.sin(i / period), 4)


def make_stats(num_points: int = 300, num_replicas: int = 2, moe: bool = True, num_layers: int = 8, num_experts: int = 16) -> dict[str, Any]:
    """A realistic, fully deterministic ``/admin/stats`` payload."""
    history = []
    for i in range(num_points):
        history.append(
            {
                "t": T0 + i,
                "rps": _wave(i, 6.0, 2.5, 17),
                "input_tps": _wave(i, 900.0, 300.0, 23),
                "output_tps": _wave(i, 420.0, 120.0, 13),
                "ttft_p50": _wave(i, 0.080, 0.02, 11),
                "ttft_p95": _wave(i, 0.210, 0.06, 11),
                "tpot_p50": _wave(i, 0.021, 0.004, 19),
                "tpot_p95": _wave(i, 0.034, 0.008, 19),
                "e2e_p50": _wave(i, 1.6, 0.4, 29),
                "e2e_p95": _wave(i, 3.1, 0.9, 29),
                "errors": 1 if i % 37 == 0 else 0,
            }
        )
    engines = {}
    for r in range(num_replicas):
        load = [[(l * 7 + e * 13 + r * 5) % 29 * 10 + (300 if e == l % num_experts else 40) for e in range(num_experts)] for l in range(num_layers)]
        engines[f"local-{r}"] = {
            "model": "demo-moe" if moe and r == 0 else "demo-llama",
            "num_running": 12 + r,
            "num_waiting": 3 * r,
            "kv_blocks_used": 700 + 150 * r,
            "kv_blocks_total": 1024,
            "kv_cache_usage": round((700 + 150 * r) / 1024, 4),
            "prefix_cache_queries": 2000 + r,
            "prefix_cache_hits": 1310 - 200 * r,
            "num_preemptions": 4 * r,
            "last_step_time_s": 0.0312 + 0.01 * r,
            "last_batch_tokens": 384 - 64 * r,
            "total_prompt_tokens": 812345,
            "total_generation_tokens": 301234,
            "num_steps": 45678,
            "expert_load": load if moe and r == 0 else None,
        }
        if r == 0:
            engines["local-0"]["spec_decode"] = {"num_draft_tokens": 4000, "num_accepted_tokens": 2900}
    if moe:
        engines["local-0"]["eplb"] = {"num_redundant_experts": 2, "imbalance_before": 2.41, "imbalance_after": 1.22}
    return {
        "time": T0 + num_points,
        "uptime_s": 3723.0,
        "window_s": 60.0,
        "requests": {"rate_rps": 6.25, "total": 23456, "errors": 12, "error_rate": 0.0021, "in_flight": 14},
        "tokens": {"input_tps": 912.4, "output_tps": 433.1, "total_input": 8123456, "total_output": 3012345},
        "latency": {
            k: {"p50": v, "p90": v * 2, "p95": v * 2.5, "p99": v * 4}
            for k, v in (("ttft", 0.081), ("tpot", 0.021), ("itl", 0.02), ("e2e", 1.62))
        },
        "slo": {
            "targets": [
                {"label": "ttft p95<=300ms", "metric": "ttft", "percentile": 95.0, "threshold_s": 0.3, "value_s": 0.2025, "met": True},
                {"label": "tpot p95<=30ms", "metric": "tpot", "percentile": 95.0, "threshold_s": 0.03, "value_s": 0.0525, "met": False},
            ],
            "attainment": 0.934,
        },
        "engines": engines,
        "breakers": {name: ("half_open" if name == "local-1" else "closed") for name in engines},
        "models": {
            "demo-llama": {"requests": 15000, "errors": 7, "input_tokens": 5000000, "output_tokens": 2000000, "cost_usd": 1.75, "share": 0.64, "cost_per_hour_usd": 1.69},
            "demo-moe": {"requests": 8456, "errors": 5, "input_tokens": 3123456, "output_tokens": 1012345, "cost_usd": 4.2, "share": 0.36, "cost_per_hour_usd": 4.06,
                         "reasoning_tokens": 404938},
        },
        "routes": {"default": 12000, "cheap_first": 8000, "escalated": 1456, "sticky_prefix": 2000},
        "cache": {"lookups": 23456, "hits": 3120},
        "escalations": 1456,
        "spend": [
            {"tenant": "acme", "key_id": None, "spend_usd": 4.95, "period": "monthly", "period_spent_usd": 41.2,
             "budget_usd": 50.0, "remaining_usd": 8.8},
            {"tenant": "acme", "key_id": "key_3f9a1c02b7e4", "spend_usd": 3.1, "period": "daily",
             "period_spent_usd": 3.1, "budget_usd": 5.0, "remaining_usd": 1.9},
            {"tenant": "acme", "key_id": "key_8d21e6aa0c5f", "spend_usd": 1.85, "period": None,
             "period_spent_usd": None, "budget_usd": None, "remaining_usd": None},
            {"tenant": "default", "key_id": None, "spend_usd": 1.0, "period": None, "period_spent_usd": None,
             "budget_usd": None, "remaining_usd": None},
        ],
        "history": history,
    }


def make_batches_view() -> dict[str, Any]:
    """A deterministic ``/admin/batches`` payload: one batch running, one finished."""
    counts = lambda total, completed, failed: {"total": total, "completed": completed, "failed": failed}  # noqa: E731
    return {
        "batches": [
            {"id": "batch_running", "tenant": "acme", "status": "in_progress", "endpoint": "/v1/chat/completions",
             "created_at": int(T0), "request_counts": counts(2000, 480, 20), "progress": 0.25, "lines_per_s": 2.5,
             "tokens_per_s": 161.3, "eta_s": 600.0},
            {"id": "batch_done", "tenant": "globex", "status": "completed", "endpoint": "/v1/chat/completions",
             "created_at": int(T0) - 60, "request_counts": counts(10, 10, 0), "progress": 1.0, "lines_per_s": None,
             "tokens_per_s": None, "eta_s": None},
        ],
        "lines_running": 16,
        "tokens_per_s": 161.3,
        "interactive": {
            "window_s": 60.0, "num_requests": 42, "ttft_p95_s": 0.2345, "tpot_p95_s": 0.031,
            "slo": [{"label": "ttft p95<=500ms", "metric": "ttft", "percentile": 95, "threshold_s": 0.5,
                     "value_s": 0.2345, "met": True}],
        },
    }  # fmt: skip


class FakeAdminClient:
    """Stands in for :class:`tokenops.tui.client.AdminClient` (same methods, same errors)."""

    def __init__(self, stats: dict[str, Any] | None = None, url: str = "http://fake:8000") -> None:
        self.url = url
        self._stats = stats if stats is not None else make_stats()
        self.is_down = False
        self.num_stats_calls = 0
        self.values = {t.name: t.default for t in TUNABLES}
        self.changes: list[list[Any]] = []
        self.batches_view = make_batches_view()

    def stats(self) -> dict[str, Any]:
        self.num_stats_calls += 1
        if self.is_down:
            raise ServerUnreachable(f"{self.url}: ConnectError: [Errno 111] Connection refused")
        return self._stats

    def tunables(self) -> list[dict[str, Any]]:
        self._check()
        return [{**t.to_dict(), "value": self.values[t.name]} for t in TUNABLES]

    def patch_tunables(self, values: dict[str, Any], actor: str = "dashboard") -> dict[str, Any]:
        self._check()
        by_name = {t.name: t for t in TUNABLES}
        try:
            applied = {}
            for name, value in values.items():
                if name not in by_name:
                    raise TunableError(f"unknown tunable {name!r}")
                applied[name] = by_name[name].validate(value)
                if not by_name[name].live:
                    raise TunableError(f"{name} is not live: it needs a restart (set it in tokenops.toml)")
        except TunableError as e:
            raise AdminError(str(e), 400) from None
        for name, value in applied.items():
            self.changes.insert(0, [f"2025-11-21 10:{len(self.changes):02d}:00", name, json.dumps(self.values[name]), json.dumps(value), actor, "admin"])
            self.values[name] = value
        return {"applied": applied, "tunables": self.tunables()}

    def query(self, name: str, **params: Any) -> dict[str, Any]:
        self._check()
        if name == "config_changes":
            return {"name": name, "columns": ["ts", "name", "old_value", "new_value", "actor", "source"], "rows": [list(r) for r in self.changes]}
        if name == "usage_by_model_day":
            return {
                "name": name,
                "columns": ["day", "model", "requests", "input_tokens", "output_tokens", "cost_usd"],
                "rows": [["2025-11-20", "demo-llama", 9000, 3000000, 1200000, 1.05], ["2025-11-20", "demo-moe", 5000, 1900000, 600000, 2.5], ["2025-11-21", "demo-llama", 6000, 2000000, 800000, 0.7]],
            }
        if name == "latency_by_model_hour":
            return {
                "name": name,
                "columns": ["hour", "model", "requests", "ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95"],
                "rows": [["2025-11-21 09:00", "demo-llama", 2100, 0.079, 0.201, 1.58, 3.02], ["2025-11-21 10:00", "demo-llama", 2300, 0.083, 0.219, 1.66, 3.3]],
            }
        if name == "images_by_model_hour":
            return {
                "name": name,
                "columns": ["hour", "model", "sampler", "requests", "images", "steps_avg", "cache_reuse", "e2e_p50"],
                "rows": [["2025-11-21 10:00", "digits-diffusion", "dpm", 40, 160, 10.0, 0.35, 0.042]],
            }
        raise AdminError(f"unknown query {name!r}; known: config_changes, images_by_model_hour, latency_by_model_hour, "
                         "usage_by_model_day", 404)

    def batches(self) -> dict[str, Any]:
        self._check()
        return self.batches_view

    def gateways(self) -> dict[str, Any]:
        self._check()
        return {"gateways": []}  # one gateway without [shared] redis_url: no registry, an empty list

    def _check(self) -> None:
        if self.is_down:
            raise ServerUnreachable(f"{self.url}: ConnectError: [Errno 111] Connection refused")
