"""The gateway's decisions as the client sees them: ``x-tokenops-*`` response headers.

``x-tokenops-model`` (the model that answered), ``x-tokenops-replica``, ``x-tokenops-cache``
(``hit; match=exact|semantic``, ``miss`` or ``bypass`` when no cache looked the request up),
``x-tokenops-route`` (``ROUTER; REASON``) and ``x-tokenops-cost-usd``. A stream sends the ones known
before its first byte as headers and all of them in its last chunk (``"tokenops": {...}``): a
stream's cost is known only at its end. ``[gateway] decision_headers = false`` turns both off.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from tokenops.gateway.observability.records import RequestRecord

_UNSAFE = re.compile(r"[^\x20-\x7e]")


def _header(value: Any) -> str:
    """A header-safe value: printable ASCII, bounded (a reason may quote a router's text)."""
    return _UNSAFE.sub("?", str(value))[:200]


def cache_result(rec: RequestRecord) -> str:
    # a plugin's key (declared by the semantic cache, not in Decisions): read as a plain mapping
    semantic = cast(Mapping[str, Any], rec.decisions).get("semantic_cache")
    if isinstance(semantic, dict):
        result = semantic.get("result")
        if result == "hit":
            match = semantic.get("match")
            return f"hit; match={match}" if match else "hit"
        return "bypass" if result == "off" else "miss"
    return "hit" if rec.decisions.get("cache") == "hit" else "bypass"


def route_value(rec: RequestRecord) -> str | None:
    route: Mapping[str, Any] = rec.decisions.get("route") or {}
    router = route.get("router") or ("cache" if rec.is_cache_hit else None)
    reason = rec.route_reason
    if router is None and reason is None:
        return None
    return f"{router or '-'}; {reason or '-'}"


def decision_values(rec: RequestRecord, *, with_cost: bool = True) -> dict[str, Any]:
    """The decisions as values (a stream's final chunk carries these)."""
    out: dict[str, Any] = {
        "model": rec.model_served,
        "replica": rec.backend,
        "cache": cache_result(rec),
        "route": route_value(rec),
    }
    if with_cost:
        out["cost_usd"] = round(rec.cost_usd, 10)
    return {k: v for k, v in out.items() if v is not None}


def decision_headers(rec: RequestRecord, *, with_cost: bool = True) -> dict[str, str]:
    values = decision_values(rec, with_cost=with_cost)
    if "cost_usd" in values:
        values["cost_usd"] = f"{values['cost_usd']:.10f}".rstrip("0").rstrip(".") or "0"
    return {f"x-tokenops-{k.replace('_', '-')}": _header(v) for k, v in values.items()}
