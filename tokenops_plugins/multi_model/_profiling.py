"""Run task suites against an OpenAI-compatible endpoint and build a capability profile."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._profiles import save_profile, wilson
from ._suites import DIMENSIONS, Task, make_suite

MAX_TOKENS = {"code": 200, "extraction": 80, "instruction": 40}


async def _ask(client: Any, url: str, model: str, task: Task, headers: dict) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": task.prompt}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS.get(task.dimension, 24),
    }
    t0 = time.perf_counter()
    try:
        r = await client.post(f"{url}/chat/completions", json=body, headers=headers)
    except Exception as e:  # an unreachable server fails the task, it does not stop the run
        return {
            "task": task.id,
            "dimension": task.dimension,
            "prompt": task.prompt,
            "correct": False,
            "error": f"{type(e).__name__}: {e}",
            "latency_s": time.perf_counter() - t0,
        }
    latency = time.perf_counter() - t0
    if r.status_code != 200:
        return {
            "task": task.id,
            "dimension": task.dimension,
            "prompt": task.prompt,
            "correct": False,
            "error": f"HTTP {r.status_code}: {r.text[:200]}",
            "latency_s": latency,
        }
    data = r.json()
    text = data["choices"][0]["message"].get("content") or ""
    usage = data.get("usage") or {}
    correct = await asyncio.to_thread(task.check, text)
    return {
        "task": task.id,
        "dimension": task.dimension,
        "prompt": task.prompt,
        "answer": text,
        "correct": bool(correct),
        "latency_s": latency,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
    }


async def run_suites(
    url: str,
    model: str,
    dimensions: list[str],
    n: int,
    seed: int = 0,
    concurrency: int = 4,
    api_key: str | None = None,
    progress: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    import httpx

    tasks = [t for d in dimensions for t in make_suite(d, n, seed)]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(task: Task) -> dict[str, Any]:
            async with sem:
                result = await _ask(client, url.rstrip("/"), model, task, headers)
            if progress:
                progress()
            return result

        return await asyncio.gather(*(one(t) for t in tasks))


def build_profile(
    model: str, results: list[dict[str, Any]], cost_in: float, cost_out: float, source: str
) -> dict[str, Any]:
    dims: dict[str, Any] = {}
    for d in DIMENSIONS:
        sub = [r for r in results if r["dimension"] == d]
        if not sub:
            continue
        k = sum(r["correct"] for r in sub)
        lo, hi = wilson(k, len(sub))
        dims[d] = {
            "score": k / len(sub),
            "ci_low": lo,
            "ci_high": hi,
            "n": len(sub),
            "errors": sum(1 for r in sub if "error" in r),
        }
    lat = sorted(r["latency_s"] for r in results)
    tin = sum(r.get("prompt_tokens", 0) for r in results)
    tout = sum(r.get("completion_tokens", 0) for r in results)
    return {
        "model": model,
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": source,
        "dimensions": dims,
        "latency": {
            "e2e_p50_s": statistics.median(lat),
            "e2e_p95_s": lat[int(0.95 * (len(lat) - 1))],
            "requests": len(lat),
        },
        "cost": {
            "usd_per_1m_input": cost_in,
            "usd_per_1m_output": cost_out,
            "usd_per_task": (tin * cost_in + tout * cost_out) / 1e6 / max(1, len(results)),
        },
    }


def write_profile(
    profile: dict[str, Any], results: list[dict[str, Any]], directory: Path, store_path: str | None
) -> Path:
    path = save_profile(profile, directory)
    with open(path.with_suffix(".results.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    if store_path:
        from tokenops.store import open_store
        from tokenops.store.table_models import CapabilityProfile

        now = datetime.now(UTC).replace(tzinfo=None)
        rows = [
            CapabilityProfile(
                model=profile["model"],
                dimension=dim,
                score=v["score"],
                ci_low=v["ci_low"],
                ci_high=v["ci_high"],
                n=v["n"],
                updated_at=now,
                source=profile["source"],
            )
            for dim, v in profile["dimensions"].items()
        ]
        with open_store(store_path) as store:  # through the server when one holds the file
            store.add(*rows)  # insert or update by (model, dimension)
    return path


def update_from_telemetry(
    profile: dict[str, Any],
    error_rate: float,
    e2e_p50_s: float | None,
    validator_pass_rate: float | None,
    weight: float = 0.2,
) -> dict[str, Any]:
    """Blend live signals into a profile (exponential moving average, ``weight`` on the new)."""
    out = dict(profile)
    running = dict(out.get("running", {}))
    for key, value in (
        ("error_rate", error_rate),
        ("e2e_p50_s", e2e_p50_s),
        ("validator_pass_rate", validator_pass_rate),
    ):
        if value is None:
            continue
        old = running.get(key)
        running[key] = value if old is None else (1 - weight) * old + weight * value
    out["running"] = running
    return out
