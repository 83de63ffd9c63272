"""What the admin API (and ``tokenops keys``) accepts for a key or a tenant.

Every problem is a :class:`FieldError` naming the field, which the API answers
with a 400; unknown fields are refused rather than ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from tokenops.keys.periods import check_period

KEY_FIELDS = ("tenant", "name", "models", "rpm", "tpm", "budget_usd", "budget_period", "soft_budget_usd", "expires_at")
TENANT_FIELDS = ("budget_usd", "budget_period", "soft_budget_usd")


class FieldError(ValueError):
    """A field the API answers 400 for; ``status`` 404 when it names something that does
    not exist (a tenant, a model): the body's shape was right."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


def _number(name: str, value: Any, *, positive: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"{name} must be a number, got {type(value).__name__}", name)
    value = float(value)
    if not math.isfinite(value):
        raise FieldError(f"{name} must be a finite number, got {value}", name)
    if value < 0 or (positive and value == 0):
        raise FieldError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value:g}", name)
    return value


#: The latest time a key may expire at (9999-12-31T23:59:59Z): the store, the admin API's ISO
#: dates and Python's datetime all end there.
MAX_EPOCH_S = 253_402_300_799.0


def parse_time(name: str, value: Any) -> float | None:
    """An ISO 8601 time (UTC when no offset is given) or epoch seconds, after 1970 and no later
    than 9999-12-31T23:59:59Z; None clears it."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise FieldError(f"{name} must be an ISO 8601 time or epoch seconds", name)
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or not 0 < value <= MAX_EPOCH_S:
            raise FieldError(
                f"{name} must be epoch seconds between 1970 and 9999-12-31T23:59:59Z "
                f"(0 < {name} <= {MAX_EPOCH_S:.0f}), got {value!r}"[:300],
                name,
            )
        return float(value)
    if isinstance(value, str):
        try:
            t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            ts = (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
        except (ValueError, OverflowError):
            raise FieldError(
                f"{name}: {value!r} is not an ISO 8601 time (e.g. 2026-12-31T00:00:00Z)"[:300], name
            ) from None
        if not 0 < ts <= MAX_EPOCH_S:  # e.g. 0001-01-01T00:00:00+14:00, 9999-12-31T23:59:59-01:00
            raise FieldError(f"{name}: {value!r} is not between 1970 and 9999-12-31T23:59:59Z"[:300], name)
        return ts
    raise FieldError(f"{name} must be an ISO 8601 time or epoch seconds", name)


def _budget(body: dict[str, Any], out: dict[str, Any], current: dict[str, Any]) -> None:
    if "budget_usd" in body:
        out["budget_usd"] = _number("budget_usd", body["budget_usd"], positive=False)
    if "soft_budget_usd" in body:
        out["soft_budget_usd"] = _number("soft_budget_usd", body["soft_budget_usd"], positive=False)
    if "budget_period" in body:
        if not isinstance(body["budget_period"], str):
            raise FieldError("budget_period must be 'daily', 'monthly' or '<N>h'", "budget_period")
        try:
            out["budget_period"] = check_period(body["budget_period"])
        except ValueError as e:
            raise FieldError(str(e), "budget_period") from None
    hard = out.get("budget_usd", current.get("budget_usd"))
    soft = out.get("soft_budget_usd", current.get("soft_budget_usd"))
    if hard is not None and soft is not None and soft > hard:
        raise FieldError(f"soft_budget_usd ({soft:g}) must not exceed budget_usd ({hard:g})", "soft_budget_usd")


def parse_key_fields(
    body: Any,
    *,
    is_new: bool,
    is_known_model: Callable[[str], bool],
    is_known_tenant: Callable[[str], bool],
    current: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The validated fields of a create (``is_new``) or update body."""
    if not isinstance(body, dict):
        raise FieldError("the body must be a JSON object")
    unknown = sorted(set(body) - set(KEY_FIELDS))
    if unknown:
        raise FieldError(f"unknown field(s) {', '.join(unknown)}; accepted: {', '.join(KEY_FIELDS)}", unknown[0])
    out: dict[str, Any] = {}
    if is_new:
        tenant = body.get("tenant")
        if not isinstance(tenant, str) or not tenant.strip():
            raise FieldError("tenant is required (a non-empty string)", "tenant")
        if not is_known_tenant(tenant):
            raise FieldError(
                f"unknown tenant {tenant!r}: create it first (PUT /admin/tenants/{tenant}, or "
                "`tokenops keys tenant NAME`) or use a tenant of [gateway] api_keys",
                "tenant",
                status=404,
                code="tenant_not_found",
            )
        out["tenant"] = tenant
    elif "tenant" in body:
        raise FieldError("a key's tenant cannot change; create a new key for the other tenant", "tenant")
    if "name" in body:
        if body["name"] is not None and not isinstance(body["name"], str):
            raise FieldError("name must be a string", "name")
        out["name"] = body["name"]
    if "models" in body:
        models = body["models"]
        if models is not None:
            if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
                raise FieldError(
                    "models must be a non-empty list of model names or aliases (null: every model)", "models"
                )
            unknown_models = [m for m in models if not is_known_model(m)]
            if unknown_models:
                raise FieldError(
                    f"unknown model(s) {', '.join(map(repr, unknown_models))}: not served by this "
                    "gateway and no router accepts the name",
                    "models",
                    status=404,
                    code="model_not_found",
                )
            models = list(dict.fromkeys(models))
        out["models"] = models
    for name in ("rpm", "tpm"):
        if name in body:
            out[name] = _number(name, body[name], positive=True)
    _budget(body, out, current or {})
    if "expires_at" in body:
        out["expires_at"] = parse_time("expires_at", body["expires_at"])
    return out


def parse_tenant_fields(body: Any, current: dict[str, Any] | None = None) -> dict[str, Any]:
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise FieldError("the body must be a JSON object")
    unknown = sorted(set(body) - set(TENANT_FIELDS))
    if unknown:
        raise FieldError(f"unknown field(s) {', '.join(unknown)}; accepted: {', '.join(TENANT_FIELDS)}", unknown[0])
    out: dict[str, Any] = {}
    _budget(body, out, current or {})
    return out


def check_tenant_name(name: str) -> str:
    if not name or len(name) > 128 or any(c.isspace() or c in "/:" for c in name):
        raise FieldError(f"tenant name {name!r} must be 1-128 characters without spaces, '/' or ':'", "tenant")
    return name
