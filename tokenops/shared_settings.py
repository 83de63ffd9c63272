"""``[shared]``: state several gateway replicas share (docs/scale-out.md). Declared apart from
:mod:`tokenops.config` (which loads it), as ``[batches]`` is."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

#: The schemes ``postgres_url`` takes; the plain ones are read as psycopg (3), the driver installed.
_SCHEMES = ("postgresql+psycopg://", "postgresql://", "postgres://")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(slots=True)
class SharedSettings:
    """Where the replicas of one service keep what every replica must see. Unset: each gateway keeps
    it in its own store, as one process always did."""

    #: PostgreSQL through SQLModel/psycopg: stored ``/v1/responses`` chains
    #: (tokenops/shared_state/postgres_responses.py), e.g. ``postgresql+psycopg://user@host:5432/db``.
    postgres_url: str | None = None
    #: Redis: session memory (TTL, byte bounds) and the semantic cache's entries, fed to every
    #: replica's own index (tokenops/shared_state/redis_memory.py, redis_cache_feed.py),
    #: e.g. ``redis://host:6379/0``.
    redis_url: str | None = None

    def __post_init__(self) -> None:
        # TypeError: what tokenops.config turns into a ConfigError naming the section and file
        url = self.postgres_url
        if url is not None and (not isinstance(url, str) or not url.startswith(_SCHEMES)):
            shown = url.split("://")[0] + "://..." if isinstance(url, str) else repr(url)
            raise TypeError(f"postgres_url: expected a postgresql+psycopg://user@host:port/database URL, got {shown}")
        if url is not None and importlib.util.find_spec("psycopg") is None:
            raise TypeError("postgres_url needs the psycopg driver: pip install 'tokenops[shared]'")
        redis_url = self.redis_url
        if redis_url is not None and (not isinstance(redis_url, str) or not redis_url.startswith(_REDIS_SCHEMES)):
            shown = redis_url.split("://")[0] + "://..." if isinstance(redis_url, str) else repr(redis_url)
            raise TypeError(f"redis_url: expected a redis://host:port/db URL, got {shown}")
        if redis_url is not None and importlib.util.find_spec("redis") is None:
            raise TypeError("redis_url needs the redis client: pip install 'tokenops[redis]'")

    @property
    def sqlalchemy_url(self) -> str | None:
        """``postgres_url`` with the psycopg driver named (SQLAlchemy's default would be psycopg2)."""
        url = self.postgres_url
        if url is None or url.startswith(_SCHEMES[0]):
            return url
        return _SCHEMES[0] + url.split("://", 1)[1]
