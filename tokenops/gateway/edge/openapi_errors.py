"""The error responses every operation can give, added to the OpenAPI document
(FastAPI documents only the 200 of routes that read their own bodies)."""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "description": "What went wrong and what to change."},
                "type": {"type": "string", "examples": ["invalid_request_error", "server_error"]},
                "param": {"type": ["string", "null"], "description": "The request field at fault, if one is."},
                "code": {"type": ["string", "null"], "examples": ["invalid_json", "model_not_found"]},
            },
        }
    },
}

_COMMON = {
    "400": "Invalid request: unparseable JSON, a bad field value, or a prompt over the context length",
    "401": "Missing or wrong API key (or admin key)",
    "404": "Unknown model, path or query",
    "408": "The request headers or body did not arrive in time",
    "413": "Request body over [gateway] max_body_bytes",
    "415": "Body not sent as application/json (servers without API keys)",
    "421": "Host name not in [gateway] allowed_hosts (servers without API keys)",
    "429": "Rate limit, budget, or too many connections from one address",
    "500": "Server error (the message carries an error id to report)",
    "503": "Model still loading, every replica failing, or the server shutting down",
}


def add_error_responses(schema: dict[str, Any]) -> dict[str, Any]:
    """Add ``ErrorResponse`` and the common error statuses to every operation of ``schema``."""
    schema.setdefault("components", {}).setdefault("schemas", {})["ErrorResponse"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for item in schema.get("paths", {}).values():
        for method, op in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            responses = op.setdefault("responses", {})
            responses.pop("422", None)  # FastAPI's default; this server answers 400 instead
            for status, description in _COMMON.items():
                responses.setdefault(
                    status, {"description": description, "content": {"application/json": {"schema": ref}}}
                )
    return schema
