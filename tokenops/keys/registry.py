"""The key registry: managed keys and tenants in memory for the request path,
persisted in the store (``api_keys``, ``tenants``), shared through Redis when
one is configured.

With Redis every change is written to two Redis hashes and bumps a version
counter; each replica reads the counter on every authenticated request (one
``GET``) and reloads the hashes when it moved, so a revoke takes effect on the
next request on every replica. Without Redis the registry is this process's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from tokenops.keys.records import Budget, ManagedKey, Tenant, new_key_id, new_secret

log = logging.getLogger("tokenops.keys")


class BudgetClock:
    """Wall clock plus an offset: tests move it (``POST /admin/budget-clock``, enabled
    by ``TOKENOPS_BUDGET_TEST_CLOCK=1``) to see budgets reset and keys expire."""

    def __init__(self, offset_s: float = 0.0) -> None:
        self.offset_s = offset_s

    def __call__(self) -> float:
        return time.time() + self.offset_s


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)


def _ts(dt: datetime | None) -> float | None:
    return None if dt is None else dt.replace(tzinfo=UTC).timestamp()


class KeyRegistry:
    def __init__(
        self,
        store: Any = None,
        redis_client: Any = None,
        *,
        config_tenants: set[str] | None = None,
        clock: Callable[[], float] | None = None,
        prefix: str = "tokenops:keys:",
    ) -> None:
        self.store = store
        self.redis = redis_client
        self.prefix = prefix
        self.clock = clock or BudgetClock()
        self.config_tenants = set(config_tenants or ())
        self._keys: dict[str, ManagedKey] = {}
        self._by_hash: dict[str, ManagedKey] = {}
        self._tenants: dict[str, Tenant] = {}
        self._version: bytes | None = None
        self._lock = threading.Lock()
        self.on_change: list[Callable[[], None]] = []
        self.generation = 0  # bumped whenever the keys or tenants change
        self._load()

    # -- loading and sharing -------------------------------------------------

    def _load(self) -> None:
        keys, tenants = self._from_store()
        if self.redis is not None:
            pipe = self.redis.pipeline(transaction=False)
            for k in keys.values():
                pipe.hsetnx(self.prefix + "all", k.id, json.dumps(k.to_dict()))
            for t in tenants.values():
                pipe.hsetnx(self.prefix + "tenants", t.name, json.dumps(t.to_dict()))
            try:
                pipe.execute()
                self._reload_from_redis()
                return
            except Exception as e:  # serve the store's keys; refresh() retries Redis on each request
                log.warning("key registry: Redis unreachable at start, using the store's keys: %s", e)
        self._install(keys, tenants)

    def _from_store(self) -> tuple[dict[str, ManagedKey], dict[str, Tenant]]:
        if self.store is None:
            return {}, {}
        cols = (
            "id",
            "tenant",
            "key_hash",
            "key_prefix",
            "name",
            "models",
            "rpm",
            "tpm",
            "budget_usd",
            "budget_period",
            "soft_budget_usd",
            "created_at",
            "expires_at",
            "revoked_at",
        )
        keys = {}
        for row in self.store.execute(f"SELECT {', '.join(cols)} FROM api_keys").fetchall():
            d = dict(zip(cols, row))
            d["models"] = json.loads(d["models"]) if d["models"] else None
            for name in ("created_at", "expires_at", "revoked_at"):
                d[name] = _ts(d[name])
            keys[d["id"]] = ManagedKey.from_dict(d)
        tenants = {}
        for name, usd, period, soft, created in self.store.execute(
            "SELECT name, budget_usd, budget_period, soft_budget_usd, created_at FROM tenants"
        ).fetchall():
            tenants[name] = Tenant(name, Budget(usd, period or "monthly", soft), _ts(created) or time.time())
        return keys, tenants

    def _install(self, keys: dict[str, ManagedKey], tenants: dict[str, Tenant]) -> None:
        by_hash = {k.key_hash: k for k in keys.values()}
        with self._lock:
            self._keys, self._by_hash, self._tenants = keys, by_hash, tenants
            self.generation += 1
        for callback in self.on_change:
            callback()

    def _reload_from_redis(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self.prefix + "version")
        pipe.hgetall(self.prefix + "all")
        pipe.hgetall(self.prefix + "tenants")
        version, raw_keys, raw_tenants = pipe.execute()
        keys = {}
        for value in raw_keys.values():
            k = ManagedKey.from_dict(json.loads(value))
            keys[k.id] = k
        tenants = {}
        for value in raw_tenants.values():
            t = Tenant.from_dict(json.loads(value))
            tenants[t.name] = t
        self._version = version
        self._install(keys, tenants)

    def refresh(self) -> None:
        """With Redis: reload when another replica changed something (one GET)."""
        if self.redis is None:
            return
        try:
            if self.redis.get(self.prefix + "version") != self._version:
                self._reload_from_redis()
        except Exception as e:  # keep serving with what we know; say so
            log.warning("key registry: Redis unreachable, using the last known keys: %s", e)

    def _publish(self, key: ManagedKey | None = None, tenant: Tenant | None = None) -> None:
        """Write ``key`` / ``tenant`` to the store, Redis and this process, or to none of them:
        everything that can be refused (a time the store cannot hold, the admin view) is built
        before the first write, and a Redis failure puts the store's rows back."""
        rows = self._store_rows(key, tenant)
        payloads = {
            "all": None if key is None else (key.id, json.dumps(key.to_dict())),
            "tenants": None if tenant is None else (tenant.name, json.dumps(tenant.to_dict())),
        }
        if key is not None:
            key.public(self.clock())  # the answer the admin API gives must render, before anything is kept
        previous = self._store_rows(
            self._keys.get(key.id) if key is not None else None,
            self._tenants.get(tenant.name) if tenant is not None else None,
        )
        if self.store is not None and rows:
            self.store.add(*rows)
        if self.redis is not None:
            try:
                pipe = self.redis.pipeline(transaction=True)
                for table, item in payloads.items():
                    if item is not None:
                        pipe.hset(self.prefix + table, *item)
                pipe.incr(self.prefix + "version")
                pipe.execute()
            except Exception:
                self._restore_store(key, tenant, previous)
                raise
            self._reload_from_redis()
        else:
            keys, tenants = dict(self._keys), dict(self._tenants)
            if key is not None:
                keys[key.id] = key
            if tenant is not None:
                tenants[tenant.name] = tenant
            self._install(keys, tenants)

    def _store_rows(self, key: ManagedKey | None, tenant: Tenant | None) -> list[Any]:
        """The store's rows of ``key`` and ``tenant`` (none without a store)."""
        if self.store is None:
            return []
        from tokenops.store.table_models import ApiKeyRow, TenantRow

        rows: list[Any] = []
        if key is not None:
            d = key.to_dict()
            d["models"] = None if key.models is None else json.dumps(key.models)
            for name in ("created_at", "expires_at", "revoked_at"):
                d[name] = _dt(d[name])
            rows.append(ApiKeyRow(**d))
        if tenant is not None:
            rows.append(
                TenantRow(
                    name=tenant.name,
                    budget_usd=tenant.budget.usd,
                    budget_period=tenant.budget.period,
                    soft_budget_usd=tenant.budget.soft_usd,
                    created_at=_dt(tenant.created_at),
                )
            )
        return rows

    def _restore_store(self, key: ManagedKey | None, tenant: Tenant | None, previous: list[Any]) -> None:
        """Undo :meth:`_publish`'s store write: the previous rows back, new ones deleted."""
        if self.store is None:
            return
        try:
            if key is not None and key.id not in self._keys:
                self.store.execute("DELETE FROM api_keys WHERE id = ?", [key.id])
            if tenant is not None and tenant.name not in self._tenants:
                self.store.execute("DELETE FROM tenants WHERE name = ?", [tenant.name])
            if previous:
                self.store.add(*previous)
        except Exception as e:  # the store itself fails: say so; the next start reads what it holds
            log.error("key registry: could not undo a store write after Redis failed: %s", e)

    # -- reads ------------------------------------------------------------------

    def lookup(self, key_hash: str) -> ManagedKey | None:
        return self._by_hash.get(key_hash)

    def get(self, key_id: str) -> ManagedKey | None:
        return self._keys.get(key_id)

    def keys(self) -> list[ManagedKey]:
        return sorted(self._keys.values(), key=lambda k: (k.created_at, k.id))

    def tenant(self, name: str) -> Tenant | None:
        return self._tenants.get(name)

    def tenants(self) -> list[Tenant]:
        return sorted(self._tenants.values(), key=lambda t: t.name)

    @property
    def has_keys(self) -> bool:
        return bool(self._keys)

    def is_known_tenant(self, name: str) -> bool:
        """A tenant record, a tenant of the config's keys, or one a live key names (a tenant
        whose keys are all revoked and whose record was deleted is gone)."""
        return (
            name in self._tenants
            or name in self.config_tenants
            or any(k.tenant == name and k.revoked_at is None for k in self._keys.values())
        )

    # -- changes ----------------------------------------------------------------

    def create(self, fields: dict[str, Any]) -> tuple[ManagedKey, str]:
        """A new key from validated fields; returns it and its secret (shown once)."""
        secret = new_secret()
        key = ManagedKey(
            id=new_key_id(),
            tenant=fields["tenant"],
            key_hash=hashlib.sha256(secret.encode()).hexdigest(),
            key_prefix=secret[:10],
            created_at=self.clock(),
        )
        self._apply(key, fields)
        self._publish(key=key)
        return key, secret

    def update(self, key_id: str, fields: dict[str, Any]) -> ManagedKey:
        key = self.get(key_id)
        if key is None:
            raise KeyError(key_id)
        key = ManagedKey.from_dict(key.to_dict())  # replicas swap whole records, never edit one in place
        self._apply(key, fields)
        self._publish(key=key)
        return key

    def revoke(self, key_id: str) -> ManagedKey:
        key = self.get(key_id)
        if key is None:
            raise KeyError(key_id)
        if key.revoked_at is None:
            key = ManagedKey.from_dict(key.to_dict())
            key.revoked_at = self.clock()
            self._publish(key=key)
        return key

    def put_tenant(self, name: str, fields: dict[str, Any]) -> Tenant:
        current = self._tenants.get(name)
        tenant = Tenant.from_dict(current.to_dict()) if current else Tenant(name, created_at=self.clock())
        _apply_budget(tenant.budget, fields)
        self._publish(tenant=tenant)
        return tenant

    def delete_tenant(self, name: str) -> list[str]:
        """Revoke the tenant's live keys (refused from the next request on every replica;
        their records stay, revoked, as does the spend already booked) and remove the
        tenant's record and budget. Returns the ids of the keys revoked here."""
        revoked = [k.id for k in self.keys() if k.tenant == name and k.revoked_at is None]
        for key_id in revoked:
            self.revoke(key_id)
        if name not in self._tenants:
            return revoked
        if self.store is not None:
            self.store.execute("DELETE FROM tenants WHERE name = ?", [name])
        if self.redis is not None:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hdel(self.prefix + "tenants", name)
            pipe.incr(self.prefix + "version")
            pipe.execute()
            self._reload_from_redis()
        else:
            self._install(dict(self._keys), {n: t for n, t in self._tenants.items() if n != name})
        return revoked

    @staticmethod
    def _apply(key: ManagedKey, fields: dict[str, Any]) -> None:
        for name in ("name", "models", "rpm", "tpm", "expires_at"):
            if name in fields:
                setattr(key, name, fields[name])
        _apply_budget(key.budget, fields)


def _apply_budget(budget: Budget, fields: dict[str, Any]) -> None:
    if "budget_usd" in fields:
        budget.usd = fields["budget_usd"]
    if "soft_budget_usd" in fields:
        budget.soft_usd = fields["soft_budget_usd"]
    if "budget_period" in fields:
        budget.period = fields["budget_period"]
