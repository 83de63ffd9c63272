"""The gateway's name for the shared API errors (:mod:`tokenops.errors`, where lower floors import them)."""

from __future__ import annotations

from tokenops.errors import APIError, ModelNotFound, sse_error

__all__ = ["APIError", "ModelNotFound", "sse_error"]
