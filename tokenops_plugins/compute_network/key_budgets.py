"""Managed keys and spend budgets at admission (see :mod:`tokenops.keys`).

Before any other admission check: a key limited to some models gets 403 on the
others; a request whose key or tenant has used up its budget for the period gets
429 ``budget_exceeded`` (saying when it resets), else it reserves its estimated
cost; past a soft budget the response carries ``x-tokenops-budget-warning``. The
request's recorded cost (cascade and ensemble members included) replaces the
estimate when its telemetry row is written. Keys' RPM/TPM become per-key limits
of the ``rate_limit`` plugin's limiter.
"""

from __future__ import annotations

from tokenops import hookimpl
from tokenops.keys import service

TOKENOPS_LAYER = "compute_network"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"keys": ("redis_url",)}


class KeyBudgets:
    """Enforces the running gateway's key service (``tokenops.keys.service.active()``); remembers
    which keys' limits it gave that gateway's ``rate_limit`` plugin (one instance per gateway)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self._synced: set[str] = set()
        self._synced_state: tuple = ()

    def sync_rate_limits(self, keys) -> None:
        """Install every active key's rpm/tpm as a ``key`` override of the rate limiter, once
        per change of the keys (or of the limiter's config, which the rate_limit plugin may
        replace when it is configured or tuned)."""
        from tokenops.plugin_manager import get_plugin

        rate_limit = get_plugin("rate_limit")  # the same gateway's instance
        if rate_limit is None:
            return
        state = (id(keys), keys.registry.generation, id(rate_limit.current_config()))
        if state == self._synced_state:
            return
        from tokenops.ratelimit.config import Limit, RateLimitConfig

        wanted = {
            k.id: Limit(requests_per_min=k.rpm, tokens_per_min=k.tpm)
            for k in keys.registry.keys()
            if (k.rpm or k.tpm) and k.revoked_at is None
        }
        if rate_limit.limiter is None and wanted:
            rate_limit.configure(RateLimitConfig(enabled=True, redis_url=keys.redis_url))
        rate_limit.set_key_overrides(wanted, self._synced - set(wanted))
        self._synced = set(wanted)
        self._synced_state = (id(keys), keys.registry.generation, id(rate_limit.current_config()))

    @hookimpl(tryfirst=True)
    def tokenops_admit(self, request):
        keys = service.active()
        if keys is None or request is None:
            return None
        self.sync_rate_limits(keys)
        return keys.guard.admit(request)

    @hookimpl
    def tokenops_record(self, event):
        keys = service.active()
        if keys is None or event.kind != "requests":
            return
        rows = event.data if isinstance(event.data, list) else [event.data]
        for row in rows:
            rid = row.get("id")
            if rid:
                keys.guard.settle(rid, float(row.get("cost_usd") or 0.0), row.get("tenant"), row.get("api_key_id"))
