"""The OpenAI-compatible gateway: FastAPI app, request pipeline, admin API, metrics."""

from tokenops.gateway.app import create_app

__all__ = ["create_app"]
