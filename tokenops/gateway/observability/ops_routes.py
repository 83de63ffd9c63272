"""Operations routes: ``/health`` (liveness), ``/ready`` (every backend loaded or failed, one serving)
and ``/metrics`` (Prometheus text, vLLM's metric names under ``tokenops:``)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenops.gateway.observability.replica_health import prometheus_text as breaker_metrics
from tokenops.gateway.observability.replica_health import replica_states
from tokenops.gateway.openai.model_routes import readiness

_JSON = "application/json"

router = APIRouter()


@router.get("/health", tags=["ops"], summary="Liveness")
async def health() -> Response:
    return Response(b'{"status":"ok"}', media_type=_JSON)


@router.get("/ready", tags=["ops"], summary="Readiness: every backend loaded or failed, one serving")
async def ready(request: Request) -> Response:
    status, body = readiness(request.app.state.gateway)  # a failed model is listed, not waited for
    return Response(json.dumps(body), status_code=status, media_type=_JSON)


@router.get("/metrics", tags=["ops"], summary="Prometheus metrics (vLLM names under tokenops:)")
async def metrics(request: Request) -> Response:
    gw = request.app.state.gateway
    gw.metrics_auth.check(request.headers)  # the admin key or [gateway] metrics_key once keys exist
    per_model: dict[str, list[dict[str, Any]]] = {}
    stats = gw.engine_stats()
    for model, rs in gw.replicas.items():
        per_model[model] = [stats[r.name] for r in rs if r.name in stats]
    for model, queue in gw.pipeline.admission.stats().items():
        if queue["waiting"]:  # in the admission queue, not yet in an engine: waiting too, as vLLM counts them
            per_model.setdefault(model, []).append({"num_waiting": queue["waiting"]})
    text = gw.prometheus.render({m: s for m, s in per_model.items() if s}, gw.replicas)
    text += breaker_metrics(replica_states(gw.replicas))
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")
