"""``GET /admin/gateways`` (admin key required): the service's gateway replicas with their health,
as the dashboard's gateways panel shows them. Each replica beats into Redis with ``[shared]
redis_url`` (:mod:`tokenops.shared_state.gateway_registry`); without it the list is this one.

Started and stopped with the app's lifespan (:func:`start_registry`, :func:`stop_registry`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from tokenops.shared_state import open_gateway_registry

router = APIRouter(tags=["admin"])


def start_registry(app: FastAPI, gateway: Any) -> None:
    settings = gateway.settings
    url = f"http://{settings.gateway.host}:{settings.gateway.port}"

    def status() -> dict[str, Any]:
        return {
            "phase": gateway.phase.value,
            "ready": bool(gateway.is_ready),
            "in_flight": int(gateway.pipeline.num_in_flight),
        }

    registry = open_gateway_registry(settings.shared, url, status)
    registry.start()
    app.state.gateway_registry = registry


def stop_registry(app: FastAPI) -> None:
    registry = getattr(app.state, "gateway_registry", None)
    if registry is not None:
        registry.stop()


@router.get("/gateways", summary="The service's gateway replicas and their health")
async def list_gateways(request: Request) -> Response:
    request.app.state.gateway.admin.check(request.headers)
    registry = getattr(request.app.state, "gateway_registry", None)
    gateways = await asyncio.to_thread(registry.gateways) if registry is not None else []
    return Response(json.dumps({"gateways": gateways}), media_type="application/json")
