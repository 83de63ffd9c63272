"""The shared-state seam: what several gateway replicas of one service must see alike.

The gateway asks :func:`open_response_store` for its stored ``/v1/responses`` and talks to the
:class:`~tokenops.shared_state.protocol.ResponseStore` protocol only; which store answers is
decided here, from ``[shared]`` (docs/scale-out.md):

- unset: the embedded default, the gateway's own DuckDB store
  (:mod:`tokenops.store.stored_responses`; an in-memory one without a store);
- ``postgres_url``: PostgreSQL through SQLModel
  (:mod:`tokenops.shared_state.postgres_responses`), the same rows for every replica.

Keys, budgets and rate limits are shared through Redis already (``[plugins.keys]`` /
``[plugins.rate_limit] redis_url``); session memory, the semantic cache, files and batches
and telemetry are still per gateway.
"""

from __future__ import annotations

from typing import Any

from tokenops.shared_settings import SharedSettings
from tokenops.shared_state.protocol import ResponseStore
from tokenops.store.stored_responses import Limits

__all__ = ["ResponseStore", "open_response_store"]


def open_response_store(shared: SharedSettings, limits: Limits, store: Any = None) -> ResponseStore:
    """The stored responses this gateway serves: shared when ``[shared] postgres_url`` is set,
    else kept in ``store`` (a :class:`tokenops.store.Store`; None: in memory)."""
    url = shared.sqlalchemy_url
    if url is not None:
        from tokenops.shared_state.postgres_responses import PostgresResponseStore

        return PostgresResponseStore(url, limits)
    from tokenops.store import Store
    from tokenops.store.stored_responses import ResponseStore as EmbeddedResponseStore

    return EmbeddedResponseStore(store if store is not None else Store.open(":memory:"), limits)
