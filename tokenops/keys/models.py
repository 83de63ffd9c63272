"""Which model names a key may be limited to: served models and names a router accepts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenops.types import GatewayRequest

#: ``hooks.get_route`` of the gateway: (request, candidates, profiles) -> a decision or None.
RouteAsker = Callable[[GatewayRequest, list[str], dict[str, Any]], Any]


def is_routable_name(
    name: str, candidates: list[str], get_route: RouteAsker, profiles: dict[str, Any] | None = None
) -> bool:
    """True when ``name`` is served or some ``tokenops_route`` router accepts it (``auto``, a
    cascade alias, ``ensemble:vote``); asks the routers, through ``get_route`` (passed in by the
    gateway or the CLI, which own the plugin manager), with a one-message probe request."""
    if name in candidates:
        return True
    probe = GatewayRequest(kind="chat", model=name, body={}, messages=[{"role": "user", "content": "ping"}])
    try:
        return get_route(probe, candidates, profiles or {}) is not None
    except Exception:  # a router refusing the name (e.g. an unknown ensemble method)
        return False
