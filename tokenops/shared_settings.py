"""``[shared]``: state several gateway replicas share (docs/scale-out.md). Declared apart from
:mod:`tokenops.config` (which loads it), as ``[batches]`` is."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

#: The schemes ``postgres_url`` takes; the plain ones are read as psycopg (3), the driver installed.
_SCHEMES = ("postgresql+psycopg://", "postgresql://", "postgres://")


@dataclass(slots=True)
class SharedSettings:
    """Where the replicas of one service keep what every replica must see. Unset: each gateway keeps
    it in its own store, as one process always did."""

    #: PostgreSQL through SQLModel/psycopg: stored ``/v1/responses`` chains
    #: (tokenops/shared_state/postgres_responses.py), e.g. ``postgresql+psycopg://user@host:5432/db``.
    postgres_url: str | None = None

    def __post_init__(self) -> None:
        # TypeError: what tokenops.config turns into a ConfigError naming the section and file
        url = self.postgres_url
        if url is not None and (not isinstance(url, str) or not url.startswith(_SCHEMES)):
            shown = url.split("://")[0] + "://..." if isinstance(url, str) else repr(url)
            raise TypeError(f"postgres_url: expected a postgresql+psycopg://user@host:port/database URL, got {shown}")
        if url is not None and importlib.util.find_spec("psycopg") is None:
            raise TypeError("postgres_url needs the psycopg driver: pip install 'tokenops[shared]'")

    @property
    def sqlalchemy_url(self) -> str | None:
        """``postgres_url`` with the psycopg driver named (SQLAlchemy's default would be psycopg2)."""
        url = self.postgres_url
        if url is None or url.startswith(_SCHEMES[0]):
            return url
        return _SCHEMES[0] + url.split("://", 1)[1]
