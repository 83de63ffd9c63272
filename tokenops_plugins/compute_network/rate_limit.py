"""Rate limits and quotas: requests/min and tokens/min token buckets per tenant,
model and API key, concurrency caps, weighted fair share, 429 with Retry-After or
a bounded queue; in Redis when ``redis_url`` is set. Off unless configured in
``[plugins.rate_limit]`` (see :mod:`tokenops.ratelimit.config`) or a
``ratelimit.tenant_*`` tunable is set above 0.

Estimated tokens are charged at admission and corrected when the request ends, on
``tokenops_request_finished`` (every request: answered, streamed, failed, disconnected or
from the cache), to the tokens its record counts.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

from tokenops import hookimpl
from tokenops.ratelimit.config import Limit, RateLimitConfig
from tokenops.ratelimit.limiter import RateLimiter
from tokenops.tunables import Tunable, TunableError

TOKENOPS_LAYER = "compute_network"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {
    "rate_limit": (
        "enabled",
        "mode",
        "queue_timeout_s",
        "burst_s",
        "redis_url",
        "key_prefix",
        "fair_share",
        "tenant",
        "tenants",
        "key",
        "keys",
        "model",
        "models",
    )
}

limiter: RateLimiter | None = None
_config = RateLimitConfig()
_TENANT_FIELDS = {
    "ratelimit.tenant_requests_per_min": "requests_per_min",
    "ratelimit.tenant_tokens_per_min": "tokens_per_min",
    "ratelimit.tenant_max_concurrency": "max_concurrency",
}


def configure(config: RateLimitConfig, store=None, **kw) -> RateLimiter | None:
    """Install ``config`` (tests pass a store or clock); returns the active limiter."""
    global limiter, _config
    _config = config
    limiter = RateLimiter(config, store=store, **kw) if config.enabled else None
    return limiter


@hookimpl
def tokenops_configure(settings):
    raw = settings.plugin_settings("rate_limit")
    if raw:
        raw = {"enabled": True, **raw}
        try:
            configure(RateLimitConfig.from_settings(raw))
        except ValueError as e:
            from tokenops.config import ConfigError

            raise ConfigError(str(e)) from None


@hookimpl
def tokenops_register_tunables(register):
    register(
        Tunable(
            "ratelimit.mode",
            "str",
            "reject",
            "Over a limit: 429 at once, or queue up to the timeout.",
            live=True,
            choices=("reject", "queue"),
            searchable=False,
        )
    )
    register(
        Tunable(
            "ratelimit.queue_timeout_s",
            "float",
            2.0,
            "Longest wait in queue mode before a 429.",
            live=True,
            minimum=0.0,
            maximum=600.0,
            searchable=False,
        )
    )
    register(
        Tunable(
            "ratelimit.burst_s",
            "float",
            6.0,
            "Burst a bucket allows, in seconds of its rate.",
            live=True,
            minimum=0.1,
            maximum=600.0,
            searchable=False,
        )
    )
    register(
        Tunable(
            "ratelimit.tenant_requests_per_min",
            "float",
            0.0,
            "Default per-tenant requests/min (0 = none).",
            live=True,
            minimum=0.0,
            maximum=1e9,
            searchable=False,
        )
    )
    register(
        Tunable(
            "ratelimit.tenant_tokens_per_min",
            "float",
            0.0,
            "Default per-tenant tokens/min (0 = none).",
            live=True,
            minimum=0.0,
            maximum=1e12,
            searchable=False,
        )
    )
    register(
        Tunable(
            "ratelimit.tenant_max_concurrency",
            "int",
            0,
            "Default per-tenant concurrent requests (0 = none).",
            live=True,
            minimum=0,
            maximum=1_000_000,
            searchable=False,
        )
    )


@hookimpl
def tokenops_apply_tunables(values):
    mine = {k: v for k, v in values.items() if k.startswith("ratelimit.")}
    if not mine:
        return
    cfg = _config
    changes = {k.split(".", 1)[1]: v for k, v in mine.items() if k not in _TENANT_FIELDS}
    tenant = cfg.defaults.get("tenant") or Limit()
    tenant_changes = {_TENANT_FIELDS[k]: (v or None) for k, v in mine.items() if k in _TENANT_FIELDS}
    try:
        if tenant_changes:
            tenant = dataclasses.replace(tenant, **tenant_changes)
        new = dataclasses.replace(cfg, **changes, defaults={**cfg.defaults, "tenant": tenant})
    except (TypeError, ValueError) as e:
        raise TunableError(str(e)) from None
    if tenant_changes and not tenant.is_empty:
        new.enabled = True
    if limiter is not None and new.redis_url == cfg.redis_url and new.enabled:
        limiter.config = new  # keep bucket levels and in-flight requests
        globals()["_config"] = new
    else:
        configure(new)


def current_config() -> RateLimitConfig:
    """The limiter's configuration now: a new object whenever the plugin is configured or tuned."""
    return _config


def set_key_overrides(wanted: dict[str, Limit], forget: set[str]) -> None:
    """Per-key limits from outside the configuration (the managed keys' rpm/tpm, key_budgets):
    ``forget`` ids lose their ``key`` override, ``wanted`` ones get theirs."""
    overrides = _config.overrides.setdefault("key", {})
    for key_id in forget:
        overrides.pop(key_id, None)
    overrides.update(wanted)


@hookimpl
def tokenops_admit(request):
    if limiter is None:
        return None
    if limiter.stats.admitted % 256 == 0:
        limiter.expire_stale()
    return limiter.admit(request)


def _uses_redis() -> bool:
    return limiter is not None and bool(limiter.config.redis_url)


_settler: ThreadPoolExecutor | None = None


def _off_loop(fn, *args) -> None:
    """tokenops_record runs on the event loop and cannot move: Redis round trips go to one background thread."""
    global _settler
    if _settler is None:
        _settler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ratelimit-settle")
    _settler.submit(fn, *args)


def _settle(request_id: str, tokens: int) -> None:
    """Correct the request's token charge to what it used and free its slot (Redis: off the loop)."""
    active = limiter
    assert active is not None  # both callers settle only while a limiter is configured
    if _uses_redis():
        _off_loop(active.complete, request_id, tokens)
    else:
        active.complete(request_id, tokens)


@hookimpl
def tokenops_request_finished(record):
    """Every finished request settles here, answered, failed, disconnected or from the cache."""
    if limiter is not None:
        _settle(record.id, int(record.tokens_in or 0) + int(record.tokens_out or 0))


@hookimpl
def tokenops_record(event):
    """A finished request reported only as a ``requests`` row (not through this gateway's
    pipeline) settles too; a request settled above is not settled twice (``complete`` is once)."""
    if limiter is None or event.kind != "requests":
        return
    rows = event.data if isinstance(event.data, list) else [event.data]
    for row in rows:
        rid = row.get("id")
        if rid:
            _settle(rid, int(row.get("tokens_in") or 0) + int(row.get("tokens_out") or 0))
