"""The local store channel's wire format and where its socket lives.

One request or response per line of JSON. Values JSON has no type for
(timestamps, dates, decimals) travel as one-key objects (``{"$ts": "..."}``) so a
row read through the channel equals the row read from the file.

The socket sits next to the store file (``tokenops.duckdb.sock``). AF_UNIX paths
are limited to ~107 bytes; a deeper store gets a socket in a private
per-user folder under the temp directory, named by a hash of the store path.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

_MAX_UNIX_PATH = 100


def socket_path(store_path: str | os.PathLike[str]) -> Path:
    """The channel's socket for the store file at ``store_path``."""
    store = Path(store_path).expanduser().resolve()
    beside = store.with_name(store.name + ".sock")
    if len(os.fsencode(str(beside))) <= _MAX_UNIX_PATH:
        return beside
    digest = hashlib.sha256(os.fsencode(str(store))).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"tokenops-{os.getuid()}" / f"{digest}.sock"


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return {"$ts": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"$td": value.total_seconds()}
    if isinstance(value, Decimal):
        return {"$dec": str(value)}
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": value.hex()}
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    raise TypeError(f"cannot send {type(value).__name__} over the store channel")


def _hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        ((key, value),) = obj.items()
        if key == "$ts":
            return dt.datetime.fromisoformat(value)
        if key == "$date":
            return dt.date.fromisoformat(value)
        if key == "$td":
            return dt.timedelta(seconds=value)
        if key == "$dec":
            return Decimal(value)
        if key == "$bytes":
            return bytes.fromhex(value)
    return obj


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, default=_default, allow_nan=True).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    return json.loads(line, object_hook=_hook)
