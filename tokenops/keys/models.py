"""Which model names a key may be limited to: served models and names a router accepts."""

from __future__ import annotations

from typing import Any


def is_routable_name(name: str, candidates: list[str], profiles: dict[str, Any] | None = None) -> bool:
    """True when ``name`` is served or some ``tokenops_route`` router accepts it (``auto``, a
    cascade alias, ``ensemble:vote``); asks the routers with a one-message probe request."""
    if name in candidates:
        return True
    from tokenops.gateway import hooks
    from tokenops.types import GatewayRequest

    probe = GatewayRequest(kind="chat", model=name, body={}, messages=[{"role": "user", "content": "ping"}])
    try:
        return hooks.get_route(probe, candidates, profiles or {}) is not None
    except Exception:  # a router refusing the name (e.g. an unknown ensemble method)
        return False
