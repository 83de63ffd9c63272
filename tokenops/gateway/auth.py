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
import secrets
from pathlib import Path

from tokenops.gateway.errors import APIError

ADMIN_KEY_FILE = "admin_key.sha256"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _as_hash(spec: str) -> str:
    """``sha256:<hex>`` stays a hash; anything else is a plain key to hash."""
    if spec.startswith("sha256:"):
        digest = spec[len("sha256:"):].strip().lower()
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

    def __init__(self, keys: dict[str, str], allow_open: bool = False) -> None:
        self._tenants = {_as_hash(k): tenant for k, tenant in keys.items()}
        self.is_open = not self._tenants
        self.allow_open = allow_open

    def tenant_for(self, headers, client_host: str | None, user: str | None = None) -> tuple[str, str | None]:
        """``(tenant, key id)`` of a request, or raise a 401."""
        if self.is_open:
            if not self.allow_open and not is_loopback(client_host):
                raise APIError(401, "This server has no API keys configured and only serves loopback clients.",
                               code="invalid_api_key")
            return (user or "default"), None
        key = bearer(headers)
        if not key:
            raise APIError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
                           code="invalid_api_key")
        digest = hash_key(key)
        tenant = self._tenants.get(digest)
        if tenant is None:
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
            raise APIError(401, "This endpoint needs the admin key: send 'Authorization: Bearer <admin key>' "
                           "or 'X-Admin-Key: <admin key>'.", code="invalid_admin_key")


def resolve_admin_key(admin_key: str | None, admin_key_hash: str | None, store_dir: str | Path | None) -> tuple[str, str | None]:
    """The admin key's hash, and the new key when one had to be generated (print it once).

    Order: an explicit key, a configured hash, the hash file in the store folder,
    else a new random key whose hash is written there.
    """
    if admin_key:
        return hash_key(admin_key), None
    if admin_key_hash:
        return _as_hash(admin_key_hash if admin_key_hash.startswith("sha256:") else "sha256:" + admin_key_hash), None
    path = Path(store_dir) / ADMIN_KEY_FILE if store_dir else None
    if path is not None and path.is_file():
        stored = path.read_text().strip()
        if len(stored) == 64:
            return stored, None
    key = "tok-admin-" + secrets.token_urlsafe(24)
    digest = hash_key(key)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(digest + "\n")
        path.chmod(0o600)
    return digest, key
