"""The OpenAPI document says what the server enforces, and the server answers what it says.

FastAPI documents what it validates itself; routes that read their own bodies (the
size limit comes first, see :mod:`tokenops.gateway.edge.body`) or answer text need the
rest declared by hand, here, in one place:

- ``/metrics`` answers ``text/plain`` (Prometheus' exposition format), not JSON;
- ``PUT /admin/tenants/{name}`` answers 201 when it creates the tenant, and 409 is
  documented where the admin API uses it;
- the admin bodies (keys, tenants, live tunables) get their schemas; the tunables'
  is built from the registry (names, types, ranges, choices; restart-only ones are
  not patchable live and so not in it).

:func:`allowed_methods` gives a 405 its ``Allow`` header: every method of every route
whose path matches (Starlette names only the first route's).

``schemathesis`` runs against a served app with all its checks
(``tests/gateway/test_openapi_contract.py``) to hold both sides to this.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from starlette.routing import Match
from starlette.types import Scope

_NUMBER_OR_NULL = {"type": ["number", "null"], "exclusiveMinimum": 0}
_PERIOD = {
    "type": "string",
    "pattern": "^(daily|monthly|[1-9][0-9]{0,4}h)$",
    "description": "daily, monthly or <N>h (a rolling window of N hours)",
}
_AMOUNT = {"type": ["number", "null"], "minimum": 0}
_BUDGET = {
    "budget_usd": _AMOUNT,
    "budget_period": _PERIOD,
    "soft_budget_usd": {**_AMOUNT, "description": "Warn above this spend; not above budget_usd."},
}
_TENANT_NAME = {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[^\\s/:]+$"}
_KEY_FIELDS = {
    "name": {"type": ["string", "null"]},
    "models": {
        "anyOf": [{"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}, {"type": "null"}],
        "description": "Model names or aliases the key may use (null: all).",
    },
    "rpm": _NUMBER_OR_NULL,
    "tpm": _NUMBER_OR_NULL,
    **_BUDGET,
    "expires_at": {
        "anyOf": [
            {"type": "string", "format": "date-time"},
            {"type": "number", "exclusiveMinimum": 0, "maximum": 253402300799},
            {"type": "null"},
        ],
        "description": "ISO 8601 time or epoch seconds, 1970 to 9999-12-31T23:59:59Z.",
    },
}
KEY_CREATE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["tenant"],
    "properties": {"tenant": _TENANT_NAME, **_KEY_FIELDS},
}
KEY_UPDATE = {"type": "object", "additionalProperties": False, "properties": _KEY_FIELDS}
TENANT_PUT = {"type": "object", "additionalProperties": False, "properties": _BUDGET}
#: POST /admin/lora: a PEFT adapter folder on the server, served as the model ``name``
LORA_LOAD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "path"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
        "path": {"type": "string", "minLength": 1, "description": "A folder under [lora] roots."},
        "base": {"type": "string"},
        "check_base": {"type": "boolean"},
    },
}
#: POST /admin/store/rows: bench/tune runs measured against this server (tokenops/store/run_target.py)
STORE_ROWS = {
    "type": "object",
    "required": ["objects"],
    "properties": {
        "objects": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["table", "values"],
                "properties": {
                    "table": {"enum": ["bench_results", "bench_runs", "tune_trials"]},
                    "values": {"type": "object"},
                },
            },
        }
    },
}


_IMAGE_VALUES: dict[str, list[Any]] = {
    "response_format": ["b64_json"],
    "output_format": ["png"],
    "background": ["auto", "opaque"],
    "quality": ["auto"],
    "stream": [False],
}


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(app: Any, scope: Scope) -> list[str]:
    """Methods of this path (for a 405's ``Allow``): the OpenAPI document's, which is what
    clients read (hidden catch-all routes that answer 405 or 404 themselves are not methods
    of the path); routes asked directly for a path the document does not list."""
    path = scope.get("path", "")
    declared = [
        m.upper()
        for template, item in app.openapi().get("paths", {}).items()
        if _template(template).fullmatch(path)
        for m in item
        if m.upper() in _METHODS
    ]
    if declared:
        return [m for m in _METHODS if m in declared]
    routes = [r for r in getattr(app.router, "routes", ()) if r.matches(scope)[0] is not Match.NONE]
    # each method asked of the routes whose path matches (included routers hide their methods)
    return [m for m in _METHODS if any(r.matches({**scope, "method": m})[0] is Match.FULL for r in routes)]


@functools.lru_cache(maxsize=256)
def _template(path: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", path)
    return re.compile(
        "".join((".+" if p.endswith(":path}") else "[^/]+") if p.startswith("{") else re.escape(p) for p in parts)
    )


def _declare_model_bodies(schema: dict[str, Any]) -> None:
    """Bodies of routes that read their own (vLLM's /tokenize, /detokenize), from their models."""
    from tokenops.gateway.openai.tokenize_api import DetokenizeRequest, TokenizeRequest

    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in (("/tokenize", TokenizeRequest), ("/detokenize", DetokenizeRequest)):
        op = schema.get("paths", {}).get(path, {}).get("post")
        if op is None or "requestBody" in op:
            continue
        full = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(full.pop("$defs", {}))
        components[model.__name__] = full
        op["requestBody"] = _body({"$ref": f"#/components/schemas/{model.__name__}"})


def _body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def tunables_schema() -> dict[str, Any]:
    """The body of ``PATCH /admin/tunables``, from the live tunables in the registry."""
    from tokenops.plugin_manager import get_tunables

    types = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}
    props: dict[str, Any] = {}
    for t in get_tunables():
        if not t.live:
            continue
        prop: dict[str, Any] = {"type": types.get(t.type, "string")}
        if t.choices is not None:
            prop["enum"] = list(t.choices)
        if t.minimum is not None:
            prop["minimum"] = t.minimum
        if t.maximum is not None:
            prop["maximum"] = t.maximum
        # or the value as text, which the registry parses (what the dashboard's editor sends)
        props[t.name] = prop if t.type == "str" else {"anyOf": [prop, {"type": "string"}], "description": t.help}
    return {
        "type": "object",
        "required": ["values"],
        "additionalProperties": False,
        "properties": {
            "values": {"type": "object", "minProperties": 1, "additionalProperties": False, "properties": props},
            "actor": {"type": "string", "description": "Who made the change (audited)."},
        },
    }


#: The Anthropic Messages API's error body (``/v1/messages`` answers in its clients' shape).
ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {
                "type": {"type": "string", "examples": ["invalid_request_error", "not_found_error"]},
                "message": {"type": "string"},
            },
        },
    },
}


def declare(schema: dict[str, Any]) -> dict[str, Any]:
    """Put what the hand-read routes enforce into the generated ``schema`` (in place)."""
    paths = schema.get("paths", {})
    schema.setdefault("components", {}).setdefault("schemas", {})["AnthropicError"] = ANTHROPIC_ERROR
    for path, item in paths.items():
        for method, op in item.items():
            if not isinstance(op, dict):
                continue
            if method == "post" and "requestBody" in op:  # every POST reads a JSON body: none is a 400
                op["requestBody"]["required"] = True
            if path.startswith("/v1/messages"):
                for status, response in op.get("responses", {}).items():
                    if status[0] in "45" and "application/json" in response.get("content", {}):
                        response["content"]["application/json"]["schema"] = {
                            "$ref": "#/components/schemas/AnthropicError"
                        }
    metrics = paths.get("/metrics", {}).get("get")
    if metrics is not None:
        metrics["responses"]["200"] = {
            "description": "Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    bodies = {
        ("/admin/keys", "post"): KEY_CREATE,
        ("/admin/keys/{key_id}", "patch"): KEY_UPDATE,
        ("/admin/tenants/{name}", "put"): TENANT_PUT,
        ("/admin/tunables", "patch"): tunables_schema(),
        ("/admin/store/rows", "post"): STORE_ROWS,
        ("/admin/lora", "post"): LORA_LOAD,
    }
    for (path, method), body in bodies.items():
        op = paths.get(path, {}).get(method)
        if op is not None:
            op["requestBody"] = _body(body, required=method != "put")
    created = {
        ("/admin/keys", "post"): "The key (its secret only here)",
        ("/admin/tenants/{name}", "put"): "The tenant was created",
    }
    for (path, method), description in created.items():
        op = paths.get(path, {}).get(method)
        if op is not None:
            op["responses"]["201"] = {
                "description": description,
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
            if method == "post":
                op["responses"].pop("200", None)
    images = paths.get("/v1/images/generations", {}).get("post")
    if images is not None:  # OpenAI's fields, narrowed to the values this server produces (400 otherwise)
        props = images["requestBody"]["content"]["application/json"]["schema"].get("properties", {})
        for name, values in _IMAGE_VALUES.items():
            if name in props:
                props[name] = {"enum": [*values, None], "description": props[name].get("description", "")}
    _declare_model_bodies(schema)
    tenant = paths.get("/admin/tenants/{name}", {})
    for op in tenant.values():
        for param in op.get("parameters", ()):
            if param.get("name") == "name":
                param["schema"] = _TENANT_NAME
    for path, item in paths.items():
        if path.startswith("/admin/"):
            for op in item.values():
                if isinstance(op, dict) and "responses" in op:
                    op["responses"].setdefault(
                        "409",
                        {
                            "description": "The target's state forbids it (revoked key, config tenant, no store)",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
                        },
                    )
    return schema
