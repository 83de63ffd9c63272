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

_TENANT_FIELDS = {
    "ratelimit.tenant_requests_per_min": "requests_per_min",
    "ratelimit.tenant_tokens_per_min": "tokens_per_min",
    "ratelimit.tenant_max_concurrency": "max_concurrency",
}


class RateLimit:
    """One gateway's rate limiter and its configuration (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.limiter: RateLimiter | None = None
        self.config = RateLimitConfig()
        self._settler: ThreadPoolExecutor | None = None

    def configure(self, config: RateLimitConfig, store=None, **kw) -> RateLimiter | None:
        """Install ``config`` (tests pass a store or clock); returns the active limiter."""
        self.config = config
        self.limiter = RateLimiter(config, store=store, **kw) if config.enabled else None
        return self.limiter

    @hookimpl
    def tokenops_configure(self, settings):
        raw = settings.plugin_settings("rate_limit")
        if raw:
            raw = {"enabled": True, **raw}
            try:
                self.configure(RateLimitConfig.from_settings(raw))
            except ValueError as e:
                from tokenops.config import ConfigError

                raise ConfigError(str(e)) from None

    @hookimpl
    def tokenops_register_tunables(self, register):
        register_tunables(register)

    @hookimpl
    def tokenops_apply_tunables(self, values):
        mine = {k: v for k, v in values.items() if k.startswith("ratelimit.")}
        if not mine:
            return
        cfg = self.config
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
        if self.limiter is not None and new.redis_url == cfg.redis_url and new.enabled:
            self.limiter.config = new  # keep bucket levels and in-flight requests
            self.config = new
        else:
            self.configure(new)

    def current_config(self) -> RateLimitConfig:
        """The limiter's configuration now: a new object whenever the plugin is configured or tuned."""
        return self.config

    def set_key_overrides(self, wanted: dict[str, Limit], forget: set[str]) -> None:
        """Per-key limits from outside the configuration (the managed keys' rpm/tpm, key_budgets):
        ``forget`` ids lose their ``key`` override, ``wanted`` ones get theirs."""
        overrides = self.config.overrides.setdefault("key", {})
        for key_id in forget:
            overrides.pop(key_id, None)
        overrides.update(wanted)

    @hookimpl
    def tokenops_admit(self, request):
        limiter = self.limiter
        if limiter is None:
            return None
        if limiter.stats.admitted % 256 == 0:
            limiter.expire_stale()
        return limiter.admit(request)

    def _settle(self, request_id: str, tokens: int) -> None:
        """Correct the request's token charge to what it used and free its slot (Redis: off the loop)."""
        active = self.limiter
        assert active is not None  # both callers settle only while a limiter is configured
        if active.config.redis_url:
            # tokenops_record runs on the event loop and cannot move: Redis round trips go to one thread
            if self._settler is None:
                self._settler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ratelimit-settle")
            self._settler.submit(active.complete, request_id, tokens)
        else:
            active.complete(request_id, tokens)

    @hookimpl
    def tokenops_request_finished(self, record):
        """Every finished request settles here, answered, failed, disconnected or from the cache."""
        if self.limiter is not None:
            self._settle(record.id, int(record.tokens_in or 0) + int(record.tokens_out or 0))

    @hookimpl
    def tokenops_record(self, event):
        """A finished request reported only as a ``requests`` row (not through this gateway's
        pipeline) settles too; a request settled above is not settled twice (``complete`` is once)."""
        if self.limiter is None or event.kind != "requests":
            return
        rows = event.data if isinstance(event.data, list) else [event.data]
        for row in rows:
            rid = row.get("id")
            if rid:
                self._settle(rid, int(row.get("tokens_in") or 0) + int(row.get("tokens_out") or 0))


def register_tunables(register) -> None:
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
