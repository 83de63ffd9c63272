"""``[plugins.rate_limit]`` settings.

Example::

    [plugins.rate_limit]
    enabled = true
    mode = "reject"                 # or "queue" (wait up to queue_timeout_s)
    queue_timeout_s = 2.0
    burst_s = 6.0                   # a bucket holds this many seconds of its rate
    redis_url = "redis://127.0.0.1:6379/0"   # optional: share limits across gateways
    [plugins.rate_limit.tenant]     # default limit for every tenant
    requests_per_min = 600
    tokens_per_min = 200000
    max_concurrency = 16
    [plugins.rate_limit.tenants.acme]   # one tenant's own limit
    tokens_per_min = 1000000
    [plugins.rate_limit.model]  /  [plugins.rate_limit.models."name"]
    [plugins.rate_limit.key]    /  [plugins.rate_limit.keys."key id"]
    [plugins.rate_limit.fair_share]
    tokens_per_min = 500000         # the gateway's total capacity shared by weight
    weights = { acme = 2.0 }
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCOPES = ("tenant", "model", "key")


@dataclass(slots=True)
class Limit:
    requests_per_min: float | None = None
    tokens_per_min: float | None = None
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_min", "tokens_per_min", "max_concurrency"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"rate_limit: {name} must be > 0, got {value}")

    @property
    def is_empty(self) -> bool:
        return self.requests_per_min is None and self.tokens_per_min is None and self.max_concurrency is None


@dataclass(slots=True)
class RateLimitConfig:
    enabled: bool = False
    mode: str = "reject"
    queue_timeout_s: float = 2.0
    burst_s: float = 6.0
    redis_url: str | None = None
    key_prefix: str = "tokenops:rl:"
    defaults: dict[str, Limit] = field(default_factory=dict)  # scope -> default limit
    overrides: dict[str, dict[str, Limit]] = field(default_factory=dict)  # scope -> name -> limit
    fair_share_tokens_per_min: float | None = None
    fair_share_weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ("reject", "queue"):
            raise ValueError(f"rate_limit: mode must be 'reject' or 'queue', got {self.mode!r}")
        if self.queue_timeout_s < 0 or self.burst_s <= 0:
            raise ValueError("rate_limit: queue_timeout_s must be >= 0 and burst_s > 0")
        if self.fair_share_tokens_per_min is not None and self.fair_share_tokens_per_min <= 0:
            raise ValueError("rate_limit: fair_share.tokens_per_min must be > 0")

    def limit_for(self, scope: str, name: str) -> Limit | None:
        limit = self.overrides.get(scope, {}).get(name) or self.defaults.get(scope)
        return None if limit is None or limit.is_empty else limit

    @classmethod
    def from_settings(cls, raw: dict[str, Any]) -> RateLimitConfig:
        raw = dict(raw)
        defaults = {s: _limit(raw.pop(s), s) for s in SCOPES if s in raw}
        overrides = {
            s: {n: _limit(v, f"{s}s.{n}") for n, v in raw.pop(f"{s}s").items()} for s in SCOPES if f"{s}s" in raw
        }
        fair = raw.pop("fair_share", {}) or {}
        known = {"enabled", "mode", "queue_timeout_s", "burst_s", "redis_url", "key_prefix"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"[plugins.rate_limit]: unknown key(s) {', '.join(unknown)}")
        return cls(
            **raw,
            defaults=defaults,
            overrides=overrides,
            fair_share_tokens_per_min=fair.get("tokens_per_min"),
            fair_share_weights={str(k): float(v) for k, v in (fair.get("weights") or {}).items()},
        )


def _limit(raw: Any, where: str) -> Limit:
    if not isinstance(raw, dict):
        raise ValueError(f"[plugins.rate_limit.{where}] must be a table")
    try:
        return Limit(**raw)
    except TypeError as e:
        raise ValueError(f"[plugins.rate_limit.{where}]: {e}") from None
