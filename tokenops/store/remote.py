"""Open the store whether or not a server holds it.

:func:`open_store` opens the DuckDB file like :meth:`Store.open`; when a running
``tokenops serve`` holds the file's lock it returns a :class:`RemoteStore`
instead, which sends the same calls (``execute``, ``run_query``, ``add``,
``record_config_change``) over the server's local channel
(:mod:`tokenops.store.channel`). Commands written against a ``Store`` get the
same rows either way.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenops.store import wire
from tokenops.store.errors import StoreError

if TYPE_CHECKING:
    from sqlmodel import SQLModel


@cache
def _models_by_table() -> dict[str, type[SQLModel]]:
    from sqlmodel import SQLModel

    import tokenops.store.table_models  # noqa: F401  (registers the tables)

    return {m.class_.__tablename__: m.class_ for m in SQLModel._sa_registry.mappers}


def model_class(table: str) -> type[SQLModel]:
    """The SQLModel class of a store table."""
    try:
        return _models_by_table()[table]
    except KeyError:
        raise StoreError(f"unknown store table {table!r}") from None


class ChannelResult:
    """What ``RemoteStore.execute`` returns: the DB-API reads the CLI uses."""

    def __init__(self, columns: list[str], rows: list[list[Any]]) -> None:
        self.description = [(c, None, None, None, None, None, None) for c in columns]
        self._rows = [tuple(r) for r in rows]
        self._next = 0

    def fetchone(self) -> tuple | None:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[tuple]:
        rows, self._next = self._rows[self._next :], len(self._rows)
        return rows

    def fetchmany(self, size: int = 1) -> list[tuple]:
        rows = self._rows[self._next : self._next + size]
        self._next += len(rows)
        return rows


def _check_owner(path: Path) -> None:
    """Talk only to a socket our own user made (another user could plant one in /tmp)."""
    st = path.lstat()
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        raise StoreError(f"{path} is not a socket of this user; refusing to use it")


class RemoteStore:
    """The store of a running server, reached through its local channel."""

    is_remote = True

    def __init__(self, store_path: str, read_only: bool = False, timeout_s: float = 300.0) -> None:
        self.path = store_path
        self.socket_path = wire.socket_path(store_path)
        self.is_read_only = read_only
        _check_owner(self.socket_path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(str(self.socket_path))
        except OSError:
            self._sock.close()
            raise
        self._file = self._sock.makefile("rwb")
        self._lock = threading.Lock()
        self.server_info: dict[str, Any] = self.call("hello")

    def call(self, op: str, **args: Any) -> Any:
        """One operation on the server's channel."""
        with self._lock:
            try:
                self._file.write(wire.encode({"op": op, **args}))
                self._file.flush()
                line = self._file.readline()
            except OSError as e:
                raise StoreError(f"lost the server's store channel {self.socket_path}: {e}") from None
        if not line:
            raise StoreError(f"the server closed its store channel {self.socket_path}")
        reply = wire.decode(line)
        if "error" in reply:
            raise StoreError(f"server store channel: {reply['error']}")
        return reply["result"]

    @property
    def schema_version(self) -> int:
        return self.server_info["schema_version"]

    def execute(self, sql: str, params: Any = None) -> ChannelResult:
        result = self.call("execute", sql=sql, params=list(params) if isinstance(params, tuple) else params)
        return ChannelResult(result["columns"], result["rows"])

    def run_query(self, name: str, **params: Any) -> dict[str, list]:
        return self.call("run_query", name=name, params=params)

    def add(self, *objects: Any) -> None:
        if self.is_read_only:
            raise StoreError(f"{self.path} is open read-only")
        payload = [{"table": o.__tablename__, "values": o.model_dump()} for o in objects]
        self.call("add", objects=payload)

    def record_config_change(
        self, name: str, old_value: Any, new_value: Any, actor: str | None = None, source: str | None = None
    ) -> int:
        if self.is_read_only:
            raise StoreError(f"{self.path} is open read-only")
        return self.call(
            "record_config_change", name=name, old_value=old_value, new_value=new_value, actor=actor, source=source
        )

    def writer(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError(f"{self.path} is held by a running server; only it writes telemetry")

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self._sock.close()

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteStore({self.path!r} via {self.socket_path})"


def connect_server(store_path: str | None = None, read_only: bool = True) -> RemoteStore | None:
    """The channel of the server holding ``store_path`` (default store), or None when none serves it."""
    from tokenops.store.store import default_path

    path = str(Path(store_path or default_path()).expanduser())
    try:
        return RemoteStore(path, read_only=read_only)
    except (OSError, StoreError):
        return None


def open_store(path: str | os.PathLike[str] | None = None, read_only: bool = False) -> Any:
    """A :class:`Store`, or a :class:`RemoteStore` when a local server holds the file.

    :raises StoreError: as :meth:`Store.open`; a lock held by a process that
        serves no channel (an older server, another tool) keeps its message.
    """
    from tokenops.store.store import Store, default_path

    path = str(path) if path is not None else default_path()
    try:
        return Store.open(path, read_only=read_only)
    except StoreError as e:
        cause = e
    sock = wire.socket_path(path)
    if "in use by" not in str(cause) or not sock.exists():
        raise cause
    try:
        return RemoteStore(str(Path(path).expanduser()), read_only=read_only)
    except (OSError, StoreError) as e:
        raise StoreError(f"{cause} (its store channel {sock} did not answer: {e})") from None


def local_server_url(store_path: str | None = None) -> str | None:
    """The URL of the ``tokenops serve`` holding this folder's store, or None."""
    remote = connect_server(store_path)
    if remote is None:
        return None
    with remote:
        return remote.server_info.get("url")
