"""Run a benchmark over one or more load levels (a ``--rate`` or ``--concurrency`` sweep)."""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from tokenops.bench.arrivals import ArrivalSpec
from tokenops.bench.loadgen import BenchError, LoadSpec, fetch_model, run_load
from tokenops.bench.metrics import RequestResult, summarize
from tokenops.bench.results import BenchRun, LevelResult
from tokenops.bench.server_metrics import hit_rate, scrape_prefix
from tokenops.bench.workloads import BenchRequest, WorkloadFactory, build_workload
from tokenops.slo import SLO


def parse_levels(text: str | None, what: str) -> list[float]:
    """``"4"`` or ``"1,2,4"`` (``inf`` allowed for rates) -> sorted positive numbers."""
    if text is None:
        return []
    try:
        vals = [float(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise BenchError(f"--{what} {text!r}: give a number or a comma-separated list like 1,2,4") from None
    if not vals or any(not v > 0 for v in vals):
        raise BenchError(f"--{what} {text!r}: values must be positive")
    return vals


@dataclass(slots=True)
class BenchPlan:
    """Everything one ``tokenops bench`` invocation does."""

    url: str
    workload: str = "synthetic"
    model: str | None = None
    num_requests: int = 100
    rates: list[float] = field(default_factory=list)
    concurrencies: list[int] = field(default_factory=list)
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    slos: list[SLO] = field(default_factory=list)
    endpoint: str = "chat"
    api_key: str | None = None
    ignore_eos: bool = False
    timeout_s: float = 300.0
    max_in_flight: int | None = None
    think_time_s: float = 0.0
    ramp_up_s: float = 0.0
    #: Sampling temperature sent with every request (0: greedy); None sends none (the server's default).
    temperature: float | None = 0.0
    workload_options: dict[str, Any] = field(default_factory=dict)
    #: Send the same prompts at every level and in every run (cache studies); by default each level of
    #: each run gets fresh prompts, so a later level does not measure a prefix cache the earlier one warmed.
    reuse_prompts: bool = False
    #: The workloads the plugins register (``tokenops.plugin_manager.get_workloads``, passed in by the CLI
    #: and the tuner); None: the built-ins (:func:`tokenops.bench.workloads.builtin_workloads`).
    registered_workloads: dict[str, WorkloadFactory] | None = None

    def __post_init__(self) -> None:
        if self.rates and self.concurrencies:
            raise BenchError("give --rate or --concurrency, not both")
        if not self.rates and not self.concurrencies:
            self.rates = [math.inf]
        if self.num_requests < 1:
            raise BenchError(f"--num-requests must be >= 1, got {self.num_requests}")


def level_label(rate: float | None, concurrency: int | None) -> str:
    if concurrency is not None:
        return f"concurrency {concurrency}"
    assert rate is not None
    return "rate inf" if math.isinf(rate) else f"rate {rate:g}/s"


async def run_level(
    plan: BenchPlan,
    model: str,
    requests: list,
    rate: float | None,
    concurrency: int | None,
    on_result: Callable[[RequestResult], None] | None = None,
) -> LevelResult:
    """Measure one load level."""
    arrival = (
        None if rate is None else ArrivalSpec(rate=rate, kind=plan.arrival, burstiness=plan.burstiness, seed=plan.seed)
    )
    spec = LoadSpec(
        url=plan.url,
        model=model,
        endpoint=plan.endpoint,
        api_key=plan.api_key,
        arrival=arrival,
        concurrency=concurrency,
        max_in_flight=plan.max_in_flight,
        timeout_s=plan.timeout_s,
        ignore_eos=plan.ignore_eos,
        think_time_s=plan.think_time_s,
        ramp_up_s=plan.ramp_up_s,
        temperature=plan.temperature,
    )
    async with httpx.AsyncClient() as scraper:
        before = await scrape_prefix(scraper, plan.url, model)
        results, duration = await run_load(requests, spec, on_result=on_result)
        after = await scrape_prefix(scraper, plan.url, model) if before is not None else None
    summary = summarize(results, duration, plan.slos, offered_rate=rate, concurrency=concurrency)
    summary.prefix_cache_hit_rate = hit_rate(before, after)
    return LevelResult(level_label(rate, concurrency), summary, results)


def level_requests(plan: BenchPlan, level: int, run_nonce: int) -> list[BenchRequest]:
    """The requests of one level: drawn with a seed of their own per run and level (fresh
    prompts, so no level measures a prefix cache an earlier level or run warmed), or with
    ``reuse_prompts`` the same ``plan.seed`` set every time. Workloads whose text is fixed
    (``file``, ``replay``) send the same text either way; the per-level prefix-cache hit
    rate shows what that costs."""
    seed = (
        plan.seed
        if plan.reuse_prompts
        else int(np.random.SeedSequence([plan.seed, run_nonce, level]).generate_state(1)[0])
    )
    return build_workload(
        plan.workload, plan.num_requests, seed, registered=plan.registered_workloads, **plan.workload_options
    )


async def run_plan(
    plan: BenchPlan, on_level: Callable[[str, int], Callable[[RequestResult], None] | None] | None = None
) -> BenchRun:
    """Run every level of ``plan``; ``on_level(label, num_expected)`` may return a per-result callback."""
    model = plan.model or await fetch_model(plan.url, plan.api_key)
    run_nonce = secrets.randbits(32)
    requests = level_requests(plan, 0, run_nonce)
    num_expected = sum(r.num_turns for r in requests)
    settings = {
        "reuse_prompts": plan.reuse_prompts,
        "prompt_nonce": None if plan.reuse_prompts else run_nonce,
        "num_requests": plan.num_requests,
        "arrival": plan.arrival,
        "burstiness": plan.burstiness,
        "seed": plan.seed,
        "endpoint": plan.endpoint,
        "ignore_eos": plan.ignore_eos,
        "rates": [r if math.isfinite(r) else "inf" for r in plan.rates],
        "concurrencies": plan.concurrencies,
        **plan.workload_options,
    }
    run = BenchRun(
        url=plan.url, model=model, workload=plan.workload, settings=settings, slos=[s.label for s in plan.slos]
    )
    levels: list[tuple[float | None, int | None]] = [(None, c) for c in plan.concurrencies]
    levels = levels or [(r, None) for r in plan.rates]
    for i, (rate, conc) in enumerate(levels):
        if i > 0:
            requests = level_requests(plan, i, run_nonce)
        cb = on_level(level_label(rate, conc), num_expected) if on_level else None
        run.levels.append(await run_level(plan, model, requests, rate, conc, cb))
    return run


def run_plan_sync(plan: BenchPlan, on_level=None) -> BenchRun:
    return asyncio.run(run_plan(plan, on_level))
