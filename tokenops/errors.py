"""Errors shared by every floor: OpenAI-style API errors (``{"error": {"message", "type", "param",
"code"}}`` with the right status), raised by backends, services and plugins and answered by the
gateway, and :class:`UserError` for the CLI. They live at the bottom so that no lower floor
imports the gateway or the CLI to raise one."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class APIError(Exception):
    """An error the gateway answers with ``status`` and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return Response(
            json.dumps(self.body()), status_code=self.status, media_type="application/json", headers=self.headers
        )


class ModelNotFound(APIError):
    """The requested model is not configured (raised by the default router)."""

    def __init__(self, model: str, available: list[str]) -> None:
        names = ", ".join(sorted(available)) or "none"
        super().__init__(
            404,
            f"The model `{model}` does not exist. Available models: {names}.",
            code="model_not_found",
            param="model",
        )


def sse_error(err: APIError) -> bytes:
    """An error reported inside an already-started event stream (the status line is gone)."""
    return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


class UserError(Exception):
    """An error the user caused; printed as one line (``tokenops.cli.main``)."""
