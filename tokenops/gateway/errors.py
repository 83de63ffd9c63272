"""The gateway's name for the shared API errors (:mod:`tokenops.errors`, where lower floors import
them), and a backend failure turned into the error the client gets."""

from __future__ import annotations

from tokenops.errors import APIError, ModelNotFound, sse_error
from tokenops.types import BackendError

__all__ = ["APIError", "ModelNotFound", "api_error", "sse_error"]


def api_error(e: BackendError, kind: str = "chat") -> APIError:
    """A backend failure as the client sees it."""
    code = getattr(e, "upstream_code", None) or {"context_length": "context_length_exceeded"}.get(e.kind, e.kind)
    message = str(e)
    if e.kind in ("context_length", "bad_request"):
        message = getattr(e, "upstream_message", None) or message
    status = e.status if 400 <= e.status < 600 else 502
    param = getattr(e, "param", None) or (
        ("messages" if kind == "chat" else "prompt") if e.kind == "context_length" else None
    )
    return APIError(status, message, code=code, param=param)
