"""A throwaway PostgreSQL server for tests of state several gateway processes share.

Started from Debian's ``postgresql`` package (``make postgres`` installs it) the way
:func:`tokenops.testing_serve.redis_server` starts ``redis-server``: ``initdb`` into a fresh
folder, ``pg_ctl start`` on a free loopback port with ``trust`` authentication and no fsync,
``pg_ctl stop`` after. PostgreSQL refuses to run as root, so as root the server runs as the
``postgres`` user the package creates (or ``nobody``), through ``runuser``::

    with postgres_server() as url:   # postgresql+psycopg://tokenops@127.0.0.1:PORT/postgres
        ...
    new_database(url, "t1")          # another empty database on the same server
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tokenops.testing_serve import free_port

USER = "tokenops"  # the superuser initdb creates


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries, no psycopg driver, or no user to run the server as."""


def _bin(name: str) -> str | None:
    """``initdb`` / ``pg_ctl``: on PATH, else the newest under Debian's /usr/lib/postgresql/N/bin."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return versions[-1] if versions else None


def _runner() -> tuple[list[str], int | None]:
    """The command prefix that runs a server binary, and the uid that owns its folder (as root)."""
    if os.geteuid() != 0:
        return [], None
    runuser = shutil.which("runuser")
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            uid = pwd.getpwnam(name).pw_uid
            if runuser:
                return [runuser, "-u", name, "--"], uid
    raise PostgresUnavailable("running as root without runuser or a postgres/nobody user: PostgreSQL refuses root")


@contextlib.contextmanager
def postgres_server(timeout_s: float = 60.0) -> Iterator[str]:
    """A PostgreSQL server on a free loopback port; yields its SQLAlchemy URL.

    Raises :class:`PostgresUnavailable` when it cannot be started here, ``RuntimeError`` when
    it does not start within ``timeout_s`` (with its log)."""
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise PostgresUnavailable("no initdb/pg_ctl (make postgres, or apt-get install -y postgresql)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PostgresUnavailable("the psycopg driver is not installed (pip install 'tokenops[shared]')") from None
    prefix, uid = _runner()
    root = tempfile.mkdtemp(prefix="tokenops-pg-")  # not under pytest's tmp: that is private to root
    if uid is not None:
        os.chown(root, uid, -1)
    data, port = os.path.join(root, "data"), free_port()
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
    try:
        _quiet(
            [*prefix, initdb, "-D", data, "-U", USER, "--auth=trust", "-N", "-E", "UTF8", "--locale=C"],
            timeout_s,
            "initdb",
        )
        start = [*prefix, pg_ctl, "-D", data, "-l", os.path.join(root, "log"), "-w", "-t", str(int(timeout_s))]
        try:
            _quiet([*start, "-o", options, "start"], timeout_s + 5, "pg_ctl start")
        except RuntimeError as e:
            log = Path(root, "log")
            raise RuntimeError(f"{e}\n{log.read_text() if log.exists() else ''}") from None
        try:
            yield f"postgresql+psycopg://{USER}@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([*prefix, pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"], capture_output=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _quiet(cmd: list[str], timeout_s: float, what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr.strip()}")


def new_database(url: str, name: str) -> str:
    """Create the empty database ``name`` on the server of ``url``; returns its URL."""
    import psycopg

    base, _, _ = url.rpartition("/")
    with psycopg.connect(base.replace("postgresql+psycopg", "postgresql") + "/postgres", autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"
