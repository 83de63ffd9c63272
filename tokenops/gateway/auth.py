"""API keys (-> tenants) and the admin key. Keys are only ever kept as SHA-256 hashes.

Rule for an open server: without ``[gateway] api_keys`` every request is served
as tenant ``default`` (or the body's ``user``), but only to loopback clients; a
server bound to a non-loopback address refuses to start without keys unless
``--allow-open`` is given (see ``tokenops serve --help``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
from pathlib import Path
from typing import Any

from tokenops.gateway.errors import APIError

ADMIN_KEY_FILE = "admin_key"  # in the store folder, mode 0600 (see tokenops.gateway.admin.admin_key)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _as_hash(spec: str) -> str:
    """``sha256:<hex>`` stays a hash; anything else is a plain key to hash."""
    if spec.startswith("sha256:"):
        digest = spec[len("sha256:") :].strip().lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            from tokenops.config import ConfigError

            raise ConfigError(f"[gateway] api_keys: {spec[:20]}... is not sha256:<64 hex digits>")
        return digest
    return hash_key(spec)


@functools.lru_cache(maxsize=4096)
def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host in ("localhost", "testclient"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bearer(headers) -> str | None:
    value = headers.get("authorization")
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip()
    return headers.get("x-api-key")


class ApiKeys:
    """API key -> tenant lookup by hash."""

    def __init__(self, keys: dict[str, str], allow_open: bool = False, managed: Any = None) -> None:
        self._tenants = {_as_hash(k): tenant for k, tenant in keys.items()}
        self.allow_open = allow_open
        #: Managed keys (``tokenops.keys.service.KeyService``): ``authenticate(hash)`` and ``has_keys``.
        self.managed = managed

    @property
    def is_open(self) -> bool:
        """No configured keys and no managed key created yet (one, even revoked, closes the server)."""
        return not self._tenants and not (self.managed is not None and self.managed.has_keys)

    def tenant_for(self, headers, client_host: str | None, user: str | None = None) -> tuple[str, str | None]:
        """``(tenant, key id)`` of a request, or raise a 401."""
        if self.is_open:
            key = bearer(headers) if self.managed is not None else None
            found = self.managed.authenticate(hash_key(key)) if key else None  # e.g. made on another replica
            if found is not None:
                return found
            if not self.allow_open and not is_loopback(client_host):
                raise APIError(
                    401,
                    "This server has no API keys configured and only serves loopback clients.",
                    code="invalid_api_key",
                )
            return (user or "default"), None
        key = bearer(headers)
        if not key:
            raise APIError(
                401,
                "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
                code="invalid_api_key",
            )
        digest = hash_key(key)
        tenant = self._tenants.get(digest)
        if tenant is None:
            found = self.managed.authenticate(digest) if self.managed is not None else None
            if found is not None:
                return found
            raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return tenant, digest[:12]


class AdminAuth:
    """Checks ``Authorization: Bearer <admin key>`` or ``X-Admin-Key`` against a stored hash."""

    def __init__(self, key_hash: str) -> None:
        assert len(key_hash) == 64
        self.key_hash = key_hash

    def check(self, headers) -> None:
        key = headers.get("x-admin-key") or bearer(headers)
        if not key or not hmac.compare_digest(hash_key(key), self.key_hash):
            raise APIError(
                401,
                "This endpoint needs the admin key: send 'Authorization: Bearer <admin key>' "
                "or 'X-Admin-Key: <admin key>'.",
                code="invalid_admin_key",
            )


def resolve_admin_key(
    admin_key: str | None, admin_key_hash: str | None, store_dir: str | Path | None
) -> tuple[str, str | None]:
    """See :func:`tokenops.gateway.admin.admin_key.resolve_admin_key` (a generated key goes to a 0600 file)."""
    from tokenops.gateway.admin.admin_key import resolve_admin_key as resolve

    return resolve(admin_key, admin_key_hash, store_dir)
