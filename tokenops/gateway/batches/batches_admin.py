"""``GET /admin/batches`` (admin key): every tenant's batches with their progress, rate and ETA,
and the interactive traffic's latency and SLO beside them (what the dashboard's batch view shows).

The interactive figures are this process's requests of the last ``window_s`` (``/admin/stats``'s
window) that were not batch lines (as ``/admin/stats``'s figures, which keep batch lines in their
own ``batch`` block)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from tokenops.gateway.batches.batch_state import batch_object, batch_runner, batch_store
from tokenops.gateway.batches.tenant_rows import dumps
from tokenops.gateway.observability.metrics_window import percentile, slo_targets

router = APIRouter(prefix="/admin", tags=["admin"])


@router.get("/batches", summary="Every tenant's batches: progress, lines/s, tokens/s, ETA; interactive latency beside")
async def admin_batches(request: Request, limit: int = Query(50, ge=1, le=500)) -> Response:
    gw = request.app.state.gateway
    gw.admin.check(request.headers)
    rows = await asyncio.to_thread(batch_store(request.app).recent_batches, limit)
    runner = batch_runner(request.app)
    batches = [_view(row, runner) for row in rows]
    running = [b for b in batches if b["lines_per_s"] is not None]
    return dumps(
        {
            "batches": batches,
            "lines_running": sum(len(r.in_flight) for r in runner.runs.values()),
            "tokens_per_s": sum(b["tokens_per_s"] or 0.0 for b in running),
            "interactive": interactive_latency(gw),
        }
    )


def _view(row: dict[str, Any], runner: Any) -> dict[str, Any]:
    batch = batch_object(row, runner.live_counts(row["id"]))
    counts = batch["request_counts"]
    num_done = counts["completed"] + counts["failed"]
    rate = runner.live_rate(row["id"])
    lines_per_s = None if rate is None else rate["lines_per_s"]
    remaining = max(0, counts["total"] - num_done)
    return {
        "id": batch["id"],
        "tenant": row["tenant"],
        "status": batch["status"],
        "endpoint": batch["endpoint"],
        "created_at": batch["created_at"],
        "request_counts": counts,
        "progress": num_done / counts["total"] if counts["total"] else None,
        "lines_per_s": lines_per_s,
        "tokens_per_s": None if rate is None else rate["tokens_per_s"],
        # None while nothing finished lately (no rate to go by) and once it is not running here
        "eta_s": remaining / lines_per_s if lines_per_s else (0.0 if remaining == 0 and rate else None),
    }


def interactive_latency(gw: Any, now: float | None = None) -> dict[str, Any]:
    """TTFT/TPOT p95 and the SLO targets over the window's requests that were not batch lines."""
    now = time.time() if now is None else now
    window = gw.window
    recs = [
        r for r in list(gw.recent) if r.priority_class != "batch" and r.arrival >= now - window.window_s and r.is_ok
    ]
    series = {
        "ttft": [r.ttft_s for r in recs if r.ttft_s is not None],
        "tpot": [r.tpot_s for r in recs if r.tpot_s is not None],
        "itl": [r.tpot_s for r in recs if r.tpot_s is not None],
        "e2e": [r.e2e_s for r in recs if r.e2e_s is not None],
    }
    targets = slo_targets(window.slos, series)
    return {
        "window_s": window.window_s,
        "num_requests": len(recs),
        "ttft_p95_s": percentile(series["ttft"], 95),
        "tpot_p95_s": percentile(series["tpot"], 95),
        "slo": targets,
    }
