"""The DuckDB store: SQLModel tables, numbered migrations, the batched telemetry
writer and named queries.

Names are imported lazily, so ``from tokenops.store import StoreError`` (done by
the CLI on every run) does not load DuckDB, SQLAlchemy or SQLModel.
"""

from __future__ import annotations

import importlib
from typing import Any

from tokenops.store.errors import StoreError

_LAZY = {
    "Store": "tokenops.store.store",
    "default_path": "tokenops.store.store",
    "open_store": "tokenops.store.remote",
    "RemoteStore": "tokenops.store.remote",
    "StoreChannel": "tokenops.store.channel",
    "TelemetryWriter": "tokenops.store.writer",
    "WriterStats": "tokenops.store.writer",
    "run_query": "tokenops.store.queries",
    "QUERIES": "tokenops.store.queries",
    "parse_since": "tokenops.store.queries",
    "apply_migrations": "tokenops.store.migrations",
    "MIGRATIONS": "tokenops.store.migrations",
    "LATEST_VERSION": "tokenops.store.migrations",
}

__all__ = ["StoreError", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenops.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
