"""``StoreError`` and the translation of DuckDB's open errors into one clear line."""

from __future__ import annotations

import re


class StoreError(RuntimeError):
    """A store problem a user can fix (file in use, missing, too new); one line."""


_PID = re.compile(r"\(PID (\d+)\)")


def is_lock_error(exc: BaseException) -> bool:
    """True when DuckDB refused the file because another process holds its lock."""
    text = str(exc)
    return "Could not set lock on file" in text or "Conflicting lock is held" in text


def translate_open_error(path: str, exc: BaseException) -> StoreError:
    """The :class:`StoreError` to raise for a failed ``duckdb.connect(path)``."""
    text = str(exc)
    if is_lock_error(exc):
        m = _PID.search(text)
        who = f"another process (PID {m.group(1)}" if m else "another process ("
        return StoreError(
            f"{path} is in use by {who}, a running `tokenops serve`?); "
            "use the admin API (GET /admin/query/NAME) or stop it"
        )
    if "different configuration" in text:
        return StoreError(
            f"{path} is already open in this process with another mode (read-only vs read-write); "
            "reuse the open Store instead of opening it twice"
        )
    if "database does not exist" in text or "No such file" in text or "Cannot open database" in text:
        return StoreError(f"no store at {path}; start `tokenops serve` (or open it read-write once) to create it")
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return StoreError(f"cannot open store {path}: {first}")
