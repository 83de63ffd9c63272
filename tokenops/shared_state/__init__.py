"""The shared-state seam: what several gateway replicas of one service must see alike.

The gateway asks :func:`open_response_store` for its stored ``/v1/responses`` and talks to the
:class:`~tokenops.shared_state.protocol.ResponseStore` protocol only; which store answers is
decided here, from ``[shared]`` (docs/scale-out.md):

- unset: the embedded default, the gateway's own DuckDB store
  (:mod:`tokenops.store.stored_responses`; an in-memory one without a store);
- ``postgres_url``: PostgreSQL through SQLModel
  (:mod:`tokenops.shared_state.postgres_responses`), the same rows for every replica.

``redis_url`` shares the hot state, in Redis: :func:`open_session_memory` (session memory,
:mod:`tokenops.shared_state.redis_memory`) and :func:`open_cache_feed` (each replica's semantic
cache fed with every replica's entries, :mod:`tokenops.shared_state.redis_cache_feed`).

Keys, budgets and rate limits are shared through Redis already (``[plugins.keys]`` /
``[plugins.rate_limit] redis_url``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenops.shared_settings import SharedSettings
from tokenops.shared_state.protocol import ResponseStore
from tokenops.store.stored_responses import Limits

__all__ = ["ResponseStore", "open_cache_feed", "open_response_store", "open_session_memory", "redis_client"]


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


def redis_client(url: str, timeout_s: float = 2.0) -> Any:
    """A client of ``[shared] redis_url`` (``timeout_s`` per call)."""
    import redis

    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def open_session_memory(shared: SharedSettings, embed: Callable[[list[str]], Any], **limits: Any) -> Any:
    """Session memory: in Redis for every replica when ``[shared] redis_url`` is set, else this
    process's (:class:`tokenops.memory.memory_store.SessionMemory`); ``limits`` are its keyword
    arguments (ttl_s, max_session_bytes, ...)."""
    if shared.redis_url is not None:
        from tokenops.shared_state.redis_memory import RedisSessionMemory

        return RedisSessionMemory(embed, redis_client(shared.redis_url), **limits)
    from tokenops.memory.memory_store import SessionMemory

    return SessionMemory(embed, **limits)


def open_cache_feed(shared: SharedSettings, cache: Any) -> Any:
    """Feed ``cache`` (a :class:`tokenops.semcache.cache.SemanticCache`) from and to the other
    replicas when ``[shared] redis_url`` is set; returns the feed (``close()`` it), or None."""
    if shared.redis_url is None:
        return None
    from tokenops.shared_state.redis_cache_feed import RedisCacheFeed

    # XREAD blocks up to 0.5 s: the socket waits longer than that
    return RedisCacheFeed(cache, redis_client(shared.redis_url, timeout_s=5.0))


def open_gateway_registry(shared: SharedSettings, url: str, status: Callable[[], dict[str, Any]]) -> Any:
    """The list of this service's gateway replicas (:mod:`tokenops.shared_state.gateway_registry`):
    every replica's heartbeat in Redis with ``[shared] redis_url``, else this replica alone."""
    from tokenops.shared_state.gateway_registry import GatewayRegistry

    client = redis_client(shared.redis_url) if shared.redis_url is not None else None
    return GatewayRegistry(url, status, client)
