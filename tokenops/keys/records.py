"""A managed API key and a tenant, as the registry keeps them (JSON-able dicts for
the store, Redis and the admin API)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from tokenops.keys.periods import iso

SECRET_PREFIX = "tok-"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(6)


@dataclass(slots=True)
class Budget:
    """A spend budget in USD over a period; ``soft_usd`` only warns."""

    usd: float | None = None
    period: str = "monthly"
    soft_usd: float | None = None

    @property
    def is_set(self) -> bool:
        return self.usd is not None or self.soft_usd is not None


@dataclass(slots=True)
class ManagedKey:
    id: str
    tenant: str
    key_hash: str  # sha256 hex of the secret; the secret itself is never kept
    key_prefix: str  # the secret's first characters, to recognise it in lists
    created_at: float = field(default_factory=time.time)
    name: str | None = None
    models: list[str] | None = None  # None: every model
    rpm: float | None = None
    tpm: float | None = None
    budget: Budget = field(default_factory=Budget)
    expires_at: float | None = None
    revoked_at: float | None = None

    def state(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def to_dict(self) -> dict[str, Any]:
        """The stored form (everything but the secret, which is never known after creation)."""
        d = dataclasses.asdict(self)
        d.pop("budget")
        d.update(budget_usd=self.budget.usd, budget_period=self.budget.period, soft_budget_usd=self.budget.soft_usd)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ManagedKey:
        d = dict(d)
        budget = Budget(
            d.pop("budget_usd", None), d.pop("budget_period", None) or "monthly", d.pop("soft_budget_usd", None)
        )
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names}, budget=budget)

    def public(self, now: float) -> dict[str, Any]:
        """The admin API's view (no hash)."""
        d = self.to_dict()
        d.pop("key_hash")
        d["state"] = self.state(now)
        for name in ("created_at", "expires_at", "revoked_at"):
            if d[name] is not None:
                d[name] = iso(d[name])
        return d


@dataclass(slots=True)
class Tenant:
    name: str
    budget: Budget = field(default_factory=Budget)
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "budget_usd": self.budget.usd,
            "budget_period": self.budget.period,
            "soft_budget_usd": self.budget.soft_usd,
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tenant:
        return cls(
            d["name"],
            Budget(d.get("budget_usd"), d.get("budget_period") or "monthly", d.get("soft_budget_usd")),
            d.get("created_at") or time.time(),
        )
