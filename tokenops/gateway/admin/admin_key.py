"""Where the admin key comes from, and where a generated one goes.

Order: ``TOKENOPS_ADMIN_KEY`` / ``[gateway] admin_key`` (or a key file given with
``--admin-key-file``), a configured ``admin_key_hash``, the key file in the store
folder (``admin_key``, mode 0600), a hash file left by older versions
(``admin_key.sha256``), else a new random key written to that key file. The key
itself is never printed: ``tokenops serve`` prints the file's path, so the key
does not end up in logs, and never needs to be on a command line (``ps``).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

ADMIN_KEY_FILE = "admin_key"
LEGACY_HASH_FILE = "admin_key.sha256"


def read_key_file(path: str | Path) -> str:
    """The key in ``path`` (first line, stripped); a ConfigError when unusable."""
    from tokenops.config import ConfigError

    try:
        key = Path(path).expanduser().read_text().strip().splitlines()[0].strip()
    except (OSError, IndexError, UnicodeDecodeError) as e:
        raise ConfigError(f"admin key file {path}: cannot read a key from it ({type(e).__name__})") from None
    if not key:
        raise ConfigError(f"admin key file {path} is empty")
    return key


def write_secret(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only (0600 from the first byte, no umask window)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def resolve_admin_key(
    admin_key: str | None, admin_key_hash: str | None, store_dir: str | Path | None
) -> tuple[str, str | None]:
    """The admin key's SHA-256 hash, and the new key when one was generated
    (written to ``store_dir/admin_key``; see :func:`key_file`)."""
    from tokenops.gateway.auth import _as_hash, hash_key

    if admin_key:
        return hash_key(admin_key), None
    if admin_key_hash:
        return _as_hash(admin_key_hash if admin_key_hash.startswith("sha256:") else "sha256:" + admin_key_hash), None
    folder = Path(store_dir) if store_dir else None
    if folder is not None:
        key_path = folder / ADMIN_KEY_FILE
        if key_path.is_file():
            return hash_key(read_key_file(key_path)), None
        legacy = folder / LEGACY_HASH_FILE
        if legacy.is_file():
            stored = legacy.read_text().strip()
            if len(stored) == 64:
                return stored, None
    key = "tok-admin-" + secrets.token_urlsafe(24)
    if folder is not None:
        write_secret(folder / ADMIN_KEY_FILE, key + "\n")
    return hash_key(key), key


def key_file(store_dir: str | Path) -> Path:
    return Path(store_dir) / ADMIN_KEY_FILE


def admin_key_notice(store_dir: str | Path | None, is_new: bool) -> str:
    """What ``tokenops serve`` prints about a key it did not get from the environment or config."""
    if store_dir is None:
        return "admin key: none saved (--no-store); set TOKENOPS_ADMIN_KEY or use --admin-key-file to use the admin API"
    path = key_file(store_dir)
    if is_new:
        return f"admin key: generated, in {path} (readable by you only)"
    if path.is_file():
        return f"admin key: in {path} (delete that file to get a new one)"
    return (
        f"admin key: the one whose hash is in {Path(store_dir) / LEGACY_HASH_FILE} "
        "(delete that file to get a new key, saved in a file)"
    )


def secure_store_files(store_path: str | Path) -> None:
    """Make the store file (and its write-ahead log) readable by its owner only."""
    path = Path(store_path).expanduser()
    for p in (path, path.with_name(path.name + ".wal")):
        if p.is_file():
            try:
                p.chmod(0o600)
            except OSError:
                pass
