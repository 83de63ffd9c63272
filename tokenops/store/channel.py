"""``StoreChannel``: the server answers store reads and writes for local CLI processes.

DuckDB lets one process hold a file, and while ``tokenops serve`` holds it no
other process can open it, not even read-only. So the server listens on a unix
socket next to the store (mode 0600, and each connection's peer must have the
server's uid: ``SO_PEERCRED``) and runs, on its own threads and cursors, what
``tokenops report``/``moe plan``/``route calibrate``/``profile``/``bench``/``tune``
would have run on the file (:class:`tokenops.store.remote.RemoteStore`).
Nothing here touches the request path: the socket is served by threads of its
own, and telemetry keeps flowing through the batched writer (crash guarantee
unchanged).

Operations (one JSON object per line, :mod:`tokenops.store.wire`):

- ``hello`` → store path, schema version, server pid and what the server
  published with :meth:`StoreChannel.publish` (its URL, models, ...).
- ``execute`` ``{sql, params}`` → ``{columns, rows}``: exactly one SELECT, run
  inside a transaction that is rolled back, so it can never change the store.
- ``run_query`` ``{name, params}`` → a named query's result.
- ``add`` ``{objects: [{table, values}]}`` → insert or update SQLModel rows.
- ``record_config_change`` ``{name, old_value, new_value, actor, source}``.
- any operation registered with :meth:`StoreChannel.register` (the gateway adds
  ``tunables``/``set_tunables`` for ``tune --apply``).
"""

from __future__ import annotations

import logging
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenops.store import wire

log = logging.getLogger("tokenops.store")

Operation = Callable[[dict[str, Any]], Any]


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a unix socket (None where the OS cannot say)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        uid = peer_uid(self.connection)
        if uid is not None and uid != os.getuid():
            self.wfile.write(wire.encode({"error": "refused: the store channel serves only its own user"}))
            return
        for line in self.rfile:
            if not line.strip():
                continue
            try:
                message = wire.decode(line)
                result = self.server.channel.dispatch(message)
                reply = {"result": result}
            except Exception as e:  # one bad request must not end the channel
                reply = {"error": f"{e}", "kind": type(e).__name__}
            try:
                self.wfile.write(wire.encode(reply))
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    channel: StoreChannel


class StoreChannel:
    """Serve ``store`` on its unix socket from background threads; :meth:`close` stops it."""

    def __init__(self, store: Any, path: str | os.PathLike[str] | None = None) -> None:
        self.store = store
        self.path = Path(path) if path is not None else wire.socket_path(store.path)
        self._info: dict[str, Any] = {"pid": os.getpid()}
        self._ops: dict[str, Operation] = {
            "hello": self._hello,
            "execute": self._execute,
            "run_query": self._run_query,
            "add": self._add,
            "record_config_change": self._record_config_change,
        }
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def publish(self, **info: Any) -> None:
        """Facts a local client may ask for with ``hello`` (the server's URL, models, ...)."""
        self._info.update(info)

    def register(self, op: str, fn: Operation) -> None:
        """Serve operation ``op`` with ``fn(message) -> JSON-able result``."""
        self._ops[op] = fn

    def start(self) -> StoreChannel:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.path.parent.stat().st_uid != os.getuid():  # a shared temp folder someone else made
            raise OSError(f"{self.path.parent} belongs to another user")
        # the caller holds the store's lock, so a socket already here is left over from a crash
        self.path.unlink(missing_ok=True)
        old_umask = os.umask(0o177)
        try:
            server = _Server(str(self.path), _Handler)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        server.channel = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="tokenops-store-channel", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    # -- operations ---------------------------------------------------------

    def dispatch(self, message: dict[str, Any]) -> Any:
        op = message.get("op")
        fn = self._ops.get(op)  # type: ignore[arg-type]
        if fn is None:
            raise ValueError(f"unknown store channel operation {op!r}")
        return fn(message)

    def _hello(self, _: dict[str, Any]) -> dict[str, Any]:
        return {**self._info, "path": self.store.path, "schema_version": self.store.schema_version}

    def _execute(self, message: dict[str, Any]) -> dict[str, Any]:
        import duckdb

        sql = message["sql"]
        statements = duckdb.extract_statements(sql)
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            raise ValueError("the store channel runs one SELECT per execute; writes go through add()")
        cur = self.store.connection.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            try:
                params = message.get("params")
                result = cur.execute(sql, params) if params is not None else cur.execute(sql)
                columns = [d[0] for d in result.description] if result.description else []
                rows = [list(r) for r in result.fetchall()] if result.description else []
            finally:
                cur.execute("ROLLBACK")  # read-only by construction
        finally:
            cur.close()
        return {"columns": columns, "rows": rows}

    def _run_query(self, message: dict[str, Any]) -> dict[str, list]:
        return self.store.run_query(message["name"], **(message.get("params") or {}))

    def _add(self, message: dict[str, Any]) -> int:
        from tokenops.store.remote import model_class

        objects = [model_class(o["table"])(**o["values"]) for o in message["objects"]]
        self.store.add(*objects)
        return len(objects)

    def _record_config_change(self, message: dict[str, Any]) -> int:
        return self.store.record_config_change(
            message["name"],
            message.get("old_value"),
            message.get("new_value"),
            actor=message.get("actor"),
            source=message.get("source"),
        )
