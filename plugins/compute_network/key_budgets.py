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

_synced: set[str] = set()


def sync_rate_limits() -> None:
    """Install every active key's rpm/tpm as a ``key`` override of the rate limiter."""
    keys = service.active
    if keys is None:
        return
    from tokenops.ratelimit.config import Limit, RateLimitConfig
    from tokenops_plugins.compute_network import rate_limit

    wanted = {k.id: Limit(requests_per_min=k.rpm, tokens_per_min=k.tpm) for k in keys.registry.keys()
              if (k.rpm or k.tpm) and k.revoked_at is None}
    if not wanted and not _synced:
        return
    if rate_limit.limiter is None and wanted:
        rate_limit.configure(RateLimitConfig(enabled=True, redis_url=keys.redis_url))
    overrides = rate_limit._config.overrides.setdefault("key", {})
    for key_id in _synced - set(wanted):
        overrides.pop(key_id, None)
    overrides.update(wanted)
    _synced.clear()
    _synced.update(wanted)


@hookimpl(trylast=True)
def tokenops_configure(settings):
    # after rate_limit's own configure (which replaces its config)
    _synced.clear()
    keys = service.active
    if keys is not None:
        if sync_rate_limits not in keys.registry.on_change:
            keys.registry.on_change.append(sync_rate_limits)
        sync_rate_limits()


@hookimpl(tryfirst=True)
def tokenops_admit(request):
    keys = service.active
    return None if keys is None or request is None else keys.guard.admit(request)


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
