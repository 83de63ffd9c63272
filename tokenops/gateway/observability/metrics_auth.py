"""Who may read ``/metrics``.

A server with API keys (configured or managed) serves ``/metrics`` only to the admin
key or to ``[gateway] metrics_key``: the scrape shows tenant names, key ids, spend
and budgets. ``metrics_key`` exists so Prometheus can hold a credential that opens
nothing else (``authorization: {credentials: ...}`` or the older ``bearer_token`` in a
scrape config send it as ``Authorization: Bearer``). A keyless server serves only
loopback clients anyway (:mod:`tokenops.gateway.auth`), and ``/metrics`` stays open
to them. ``[gateway] metrics_per_tenant = false`` leaves the per-tenant and per-key
series out of the scrape (their totals stay).
"""

from __future__ import annotations

import hmac
from typing import Any

from tokenops.gateway.auth import _as_hash, bearer, hash_key
from tokenops.gateway.errors import APIError


class MetricsAuth:
    """Checks a scrape's credentials (see the module docstring)."""

    def __init__(self, api_keys: Any, admin: Any, metrics_key: str | None) -> None:
        self.api_keys = api_keys
        self.admin = admin
        self.metrics_key_hash = _as_hash(metrics_key) if metrics_key else None

    def check(self, headers: Any) -> None:
        """Raise a 401 unless the request may read ``/metrics``."""
        if self.api_keys.is_open:
            return
        key = headers.get("x-admin-key") or bearer(headers)
        if key:
            digest = hash_key(key)
            if hmac.compare_digest(digest, self.admin.key_hash):
                return
            if self.metrics_key_hash is not None and hmac.compare_digest(digest, self.metrics_key_hash):
                return
        raise APIError(
            401,
            "/metrics needs the admin key or [gateway] metrics_key on a server with API keys: send "
            "'Authorization: Bearer <key>' (Prometheus: authorization.credentials).",
            code="invalid_admin_key",
        )
