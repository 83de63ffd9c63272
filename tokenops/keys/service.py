"""``KeyService``: what one gateway holds for managed keys — the registry, the
spend ledger (in-process, or Redis when ``[plugins.keys] redis_url`` or
``[plugins.rate_limit] redis_url`` is set) and the admission guard — plus the
401 rule for revoked and expired keys and the ``/metrics`` lines.

``active()`` is the service of the gateway serving the running request (each gateway owns one
and sets it around its requests, :data:`in_use`), which the ``key_budgets`` plugin enforces.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from tokenops.errors import APIError
from tokenops.keys.guard import KeyGuard
from tokenops.keys.ledger import LocalLedger, RedisLedger
from tokenops.keys.periods import iso, window
from tokenops.keys.registry import BudgetClock, KeyRegistry

log = logging.getLogger("tokenops.keys")

#: Set to 1 to enable ``POST /admin/budget-clock`` (tests move the budget clock with it).
TEST_CLOCK_ENV = "TOKENOPS_BUDGET_TEST_CLOCK"

#: The running gateway's key service (``Gateway.scope`` sets it); None outside a gateway.
in_use: ContextVar[KeyService | None] = ContextVar("tokenops_key_service", default=None)


def active() -> KeyService | None:
    return in_use.get()


#: How often an open server (no key known yet) asks Redis whether a key was created elsewhere.
OPEN_RECHECK_S = 1.0


def redis_url_of(settings: Any) -> str | None:
    return (
        settings.plugin_settings("keys").get("redis_url")
        or settings.plugin_settings("rate_limit").get("redis_url")
        or None
    )


def redis_client(url: str) -> Any:
    try:
        import redis
    except ImportError:
        raise RuntimeError("a redis_url needs the redis client: pip install 'tokenops[redis]'") from None
    return redis.Redis.from_url(url, socket_timeout=2.0)


class KeyService:
    def __init__(
        self, registry: KeyRegistry, guard: KeyGuard, *, redis_url: str | None = None, store: Any = None
    ) -> None:
        self.registry = registry
        self.guard = guard
        self.redis_url = redis_url
        self.store = store
        self.is_test_clock_enabled = os.environ.get(TEST_CLOCK_ENV) == "1"
        self._open_checked_at = -OPEN_RECHECK_S
        registry.on_change.append(self.seed_from_store)
        self.seed_from_store()

    @classmethod
    def from_settings(
        cls,
        settings: Any,
        store: Any = None,
        prices: dict[str, tuple[float, float]] | None = None,
        route: Callable[[Any], Any] | None = None,
    ) -> KeyService:
        url = redis_url_of(settings)
        client = redis_client(url) if url else None
        registry = KeyRegistry(
            store, client, config_tenants=set(settings.gateway.api_keys.values()), clock=BudgetClock()
        )
        ledger = RedisLedger(client) if client is not None else LocalLedger()
        if prices is None:
            prices = {m.name: (m.cost_input_per_1m, m.cost_output_per_1m) for m in settings.models}
        return cls(registry, KeyGuard(registry, ledger, prices, route), redis_url=url, store=store)

    # -- auth --------------------------------------------------------------------

    @property
    def has_keys(self) -> bool:
        # A key created on another replica closes this (open, loopback-only) one too; asked at
        # most once a second, so an open server with Redis does not pay a GET per request.
        if not self.registry.has_keys and time.monotonic() - self._open_checked_at >= OPEN_RECHECK_S:
            self._open_checked_at = time.monotonic()
            self.registry.refresh()
        return self.registry.has_keys

    def authenticate(self, key_hash: str) -> tuple[str, str] | None:
        """``(tenant, key id)`` of a managed key; 401 when it is revoked or expired; None when unknown."""
        self.registry.refresh()
        key = self.registry.lookup(key_hash)
        if key is None:
            return None
        state = key.state(self.registry.clock())
        if state == "revoked":
            assert key.revoked_at is not None  # what makes a key revoked
            raise APIError(
                401, f"This API key ({key.id}) was revoked at {iso(key.revoked_at)}.", code="revoked_api_key"
            )
        if state == "expired":
            assert key.expires_at is not None  # what makes a key expire
            raise APIError(401, f"This API key ({key.id}) expired at {iso(key.expires_at)}.", code="expired_api_key")
        return key.tenant, key.id

    # -- spend -------------------------------------------------------------------

    def seed_from_store(self) -> None:
        """Start each budget's current period at the spend the store already recorded
        (after a restart); a ledger that knows the period (Redis) keeps its value."""
        if self.store is None:
            return
        now = self.registry.clock()
        scopes = [("key", k.id, k.budget, "api_key_id") for k in self.registry.keys() if k.budget.is_set]
        scopes += [("tenant", t.name, t.budget, "tenant") for t in self.registry.tenants() if t.budget.is_set]
        for scope, name, budget, column in scopes:
            w = window(budget.period, now)
            keys = self.guard.ledger_keys(scope, name, budget.period, w)
            try:
                rows = self.store.execute(
                    f"SELECT floor((epoch(ts) - ?) / ?) AS bucket, coalesce(sum(cost_usd), 0) FROM requests "
                    f"WHERE {column} = ? AND ts >= ? GROUP BY ALL",
                    [w.starts[0], w.bucket_s, name, datetime.fromtimestamp(w.starts[0], UTC).replace(tzinfo=None)],
                ).fetchall()
            except Exception as e:
                log.warning("budget of %s %s: could not read its spend from the store: %s", scope, name, e)
                continue
            for bucket, spent in rows:
                if 0 <= int(bucket) < len(keys):
                    self.guard.ledger.seed(keys[int(bucket)], float(spent), self.guard.ttl_s(w, now))

    def key_view(self, key: Any) -> dict[str, Any]:
        view = key.public(self.registry.clock())
        if key.budget.is_set:
            view["usage"] = self.guard.usage("key", key.id, key.budget)
        return view

    def tenant_view(self, tenant: Any) -> dict[str, Any]:
        view = {
            "name": tenant.name,
            "budget_usd": tenant.budget.usd,
            "budget_period": tenant.budget.period,
            "soft_budget_usd": tenant.budget.soft_usd,
            "created_at": iso(tenant.created_at),
        }
        if tenant.budget.is_set:
            view["usage"] = self.guard.usage("tenant", tenant.name, tenant.budget)
        return view

    def spend_rows(self) -> list[dict[str, Any]]:
        """USD settled in this process per (tenant, key), for the dashboard and /admin/keys."""
        with self.guard._lock:
            spend = dict(self.guard.stats.spend)
        return [{"tenant": t, "key_id": k or None, "spend_usd": v} for (t, k), v in sorted(spend.items())]

    def dashboard_rows(self) -> list[dict[str, Any]]:
        """Spend per tenant and key (USD served by this gateway since it started) with the
        current period's budget use where a budget is set; a ``key_id`` of None is the
        tenant's total, shown when the tenant has a budget or more than one key."""
        spend: dict[tuple[str, str | None], float] = {}
        with self.guard._lock:
            for (tenant, key), value in self.guard.stats.spend.items():
                spend[(tenant, key or None)] = spend.get((tenant, key or None), 0.0) + value
        per_tenant: dict[str, float] = {}
        num_keys: dict[str, int] = {}
        for (tenant, _), value in spend.items():
            per_tenant[tenant] = per_tenant.get(tenant, 0.0) + value
            num_keys[tenant] = num_keys.get(tenant, 0) + 1
        rows = []
        budgeted = {k.id: k for k in self.registry.keys() if k.budget.is_set and k.revoked_at is None}
        for managed in budgeted.values():
            spend.setdefault((managed.tenant, managed.id), 0.0)
        tenants = {t.name: t for t in self.registry.tenants() if t.budget.is_set}
        for name in set(tenants) | {t for t, n in num_keys.items() if n > 1}:
            rows.append(self._row(name, None, per_tenant.get(name, 0.0), tenants.get(name)))
        for (tenant, key_id), value in spend.items():
            rows.append(self._row(tenant, key_id, value, budgeted.get(key_id) if key_id else None))
        return sorted(rows, key=lambda r: (r["tenant"], r["key_id"] is not None, r["key_id"] or ""))

    def _row(self, tenant: str, key_id: str | None, spend: float, owner: Any) -> dict[str, Any]:
        row: dict[str, Any] = {
            "tenant": tenant,
            "key_id": key_id,
            "spend_usd": spend,
            "period": None,
            "period_spent_usd": None,
            "budget_usd": None,
            "remaining_usd": None,
        }
        if owner is not None:
            scope, name = ("key", owner.id) if key_id else ("tenant", owner.name)
            try:
                usage = self.guard.usage(scope, name, owner.budget)
            except Exception as e:  # Redis blinked: show the spend without the budget
                log.warning("budget usage of %s %s: %s", scope, name, e)
                return row
            row.update(
                period=usage["period"],
                period_spent_usd=usage["spent_usd"],
                budget_usd=usage["budget_usd"],
                remaining_usd=usage["remaining_usd"],
            )
        return row

    # -- /metrics ----------------------------------------------------------------

    def prometheus_lines(self, per_tenant: bool = True) -> Iterable[str]:
        """The spend and budget series; without ``per_tenant`` only the total spend and
        refusal counts, with no tenant, key or budget label (``[gateway] metrics_per_tenant``)."""
        from tokenops.prometheus_text import PREFIX
        from tokenops.prometheus_text import label as _label
        from tokenops.prometheus_text import number as _num

        stats = self.guard.stats
        with self.guard._lock:
            spend, warnings, refusals = dict(stats.spend), dict(stats.warnings), dict(stats.refusals)
        name = PREFIX + "spend_usd_total"
        if not per_tenant:
            yield f"# HELP {name} Cost of the requests served by this gateway, USD."
            yield f"# TYPE {name} counter"
            yield f"{name} {_num(sum(spend.values()))}"
            for metric, values in (("budget_soft_warnings_total", warnings), ("budget_rejections_total", refusals)):
                yield f"# TYPE {PREFIX + metric} counter"
                yield f"{PREFIX + metric} {sum(values.values())}"
            return
        yield f"# HELP {name} Cost of the requests served by this gateway, USD, by tenant and API key."
        yield f"# TYPE {name} counter"
        for (tenant, key), value in sorted(spend.items()):
            yield f'{name}{{tenant="{_label(tenant)}",key_id="{_label(key)}"}} {_num(value)}'
        remaining = PREFIX + "budget_remaining_usd"
        spent = PREFIX + "budget_spent_usd"
        budgets = [("key", k.id, k.budget) for k in self.registry.keys() if k.budget.is_set and k.revoked_at is None]
        budgets += [("tenant", t.name, t.budget) for t in self.registry.tenants() if t.budget.is_set]
        usage = []
        for scope, who, budget in budgets:
            try:
                usage.append((scope, who, self.guard.usage(scope, who, budget)))
            except Exception as e:  # a scrape must not fail because Redis blinked
                log.warning("budget usage of %s %s: %s", scope, who, e)
        yield f"# HELP {spent} Spend committed in the current budget period, USD (shared across replicas with Redis)."
        yield f"# TYPE {spent} gauge"
        for scope, who, u in usage:
            yield f'{spent}{{scope="{scope}",name="{_label(who)}",period="{u["period"]}"}} {_num(u["spent_usd"])}'
        yield f"# HELP {remaining} Budget left in the current period, USD (hard budgets only)."
        yield f"# TYPE {remaining} gauge"
        for scope, who, u in usage:
            if u["remaining_usd"] is not None:
                yield f'{remaining}{{scope="{scope}",name="{_label(who)}",period="{u["period"]}"}} {_num(u["remaining_usd"])}'
        for metric, values, doc in (
            ("budget_soft_warnings_total", warnings, "Requests admitted over a soft budget."),
            ("budget_rejections_total", refusals, "Requests refused over a hard budget."),
        ):
            full = PREFIX + metric
            yield f"# HELP {full} {doc}"
            yield f"# TYPE {full} counter"
            for (scope, who), value in sorted(values.items()):
                yield f'{full}{{scope="{scope}",name="{_label(who)}"}} {value}'
