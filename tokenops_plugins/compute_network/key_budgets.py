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

_synced: set[str] = set()
_synced_state: tuple = ()


def sync_rate_limits(keys) -> None:
    """Install every active key's rpm/tpm as a ``key`` override of the rate limiter, once
    per change of the keys (or of the limiter's config, which the rate_limit plugin may
    replace when it is configured or tuned)."""
    global _synced_state
    from . import rate_limit

    state = (id(keys), keys.registry.generation, id(rate_limit.current_config()))
    if state == _synced_state:
        return
    from tokenops.ratelimit.config import Limit, RateLimitConfig

    wanted = {
        k.id: Limit(requests_per_min=k.rpm, tokens_per_min=k.tpm)
        for k in keys.registry.keys()
        if (k.rpm or k.tpm) and k.revoked_at is None
    }
    if rate_limit.limiter is None and wanted:
        rate_limit.configure(RateLimitConfig(enabled=True, redis_url=keys.redis_url))
    rate_limit.set_key_overrides(wanted, _synced - set(wanted))
    _synced.clear()
    _synced.update(wanted)
    _synced_state = (id(keys), keys.registry.generation, id(rate_limit.current_config()))


@hookimpl(tryfirst=True)
def tokenops_admit(request):
    keys = service.active
    if keys is None or request is None:
        return None
    sync_rate_limits(keys)
    return keys.guard.admit(request)


@hookimpl
def tokenops_record(event):
    keys = service.active
    if keys is None or event.kind != "requests":
        return
    rows = event.data if isinstance(event.data, list) else [event.data]
    for row in rows:
        rid = row.get("id")
        if rid:
            keys.guard.settle(rid, float(row.get("cost_usd") or 0.0), row.get("tenant"), row.get("api_key_id"))
