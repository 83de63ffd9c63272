"""Choosing a replica for an endpoint that only some backends serve (embeddings, images)."""

from __future__ import annotations

from typing import Any

from tokenops.gateway.errors import APIError, ModelNotFound


def choose_capable_replica(
    pipeline: Any, request: Any, rec: Any, *, reason: str, method: str, does: str, use: str, alternatives: list[str]
) -> Any:
    """A replica of ``request.model`` whose backend has ``method`` (``rec.route_reason`` set to
    ``reason``): a 404 for an unknown model, a 400 when the model's backend cannot ``does``
    (e.g. "serve embeddings") that names ``alternatives`` (``use``: "an embedding model")."""
    if request.model not in pipeline.replicas:
        raise ModelNotFound(request.model, list(pipeline.replicas))
    rec.route_reason = reason
    replica = pipeline._choose(request, rec, request.model)
    if not hasattr(replica.backend, method):
        raise APIError(
            400,
            f"The model `{request.model}` does not {does} (backend {replica.backend.kind}); "
            f"use {use}: {', '.join(alternatives) or 'none is configured'}.",
            code="model_not_supported",
            param="model",
        )
    return replica
