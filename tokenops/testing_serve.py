"""A real ``tokenops serve`` process on a free loopback port, for end-to-end tests.

The way vLLM tests its OpenAI server: start the real command in a subprocess, wait
for ``/ready``, drive it with the client users use (openai SDK, LangChain, httpx),
stop it with SIGTERM. Use it as a context manager::

    with ServeProcess(tmp_path, config="[[models]]\\nname = ...") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        ...

``config`` is the text of a ``tokenops.toml`` (written into ``workdir``); ``args`` are
extra command-line arguments; ``env`` extra environment (``TOKENOPS_PLUGINS=file.py``
loads a test plugin). The store lives in ``workdir/store/tokenops.duckdb`` unless
``store=False``. When the server dies or does not become ready, the assertion error
carries its log.

``redis_server(workdir)`` starts a throwaway ``redis-server`` for tests of state shared
by several gateway processes (rate limits, keys and budgets).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ADMIN_KEY = "serve-test-admin-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """``tokenops serve`` in a subprocess; ``url`` is its root, ``base_url`` its ``/v1``."""

    def __init__(
        self,
        workdir: Path | str,
        *,
        config: str | None = None,
        args: list[str] | tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        store: bool = True,
        ready_timeout_s: float = 180.0,
        admin_key: str = ADMIN_KEY,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.url}/v1"
        self.admin_key = admin_key
        self.store_path = self.workdir / "store" / "tokenops.duckdb"
        self.log_path = self.workdir / f"serve-{self.port}.log"
        self._config = config
        self._args = list(args)
        self._env = dict(env or {})
        self._store = store
        self._ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"X-Admin-Key": self.admin_key}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "tokenops", "serve", "--port", str(self.port)]
        if self._config is not None:
            cfg = self.workdir / "tokenops.toml"
            cfg.write_text(self._config)
            cmd += ["--config", str(cfg)]
        cmd += ["--store", str(self.store_path)] if self._store else ["--no-store"]
        return cmd + self._args

    def start(self) -> ServeProcess:
        import httpx

        env = dict(os.environ, TOKENOPS_ADMIN_KEY=self.admin_key, **self._env)
        log = open(self.log_path, "w")  # noqa: SIM115 (the server writes it for its whole life; closed in stop())
        self.proc = subprocess.Popen(
            self.command(), cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
        log.close()
        deadline = time.monotonic() + self._ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"tokenops serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"tokenops serve not ready within {self._ready_timeout_s:.0f} s:\n{self.log()}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (graceful drain), SIGKILL if it does not exit in ``timeout_s``; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class RedisUnavailable(RuntimeError):
    """No ``redis-server`` binary or no ``redis`` client package (``make redis`` installs both)."""


@contextlib.contextmanager
def redis_server(workdir: Path | str, timeout_s: float = 5.0) -> Iterator[str]:
    """A throwaway ``redis-server`` on a free loopback port (no persistence); yields its URL.

    Raises :class:`RedisUnavailable` when the binary or the client is missing, and
    ``RuntimeError`` when the server does not answer within ``timeout_s``.
    """
    binary = shutil.which("redis-server")
    try:
        import redis
    except ImportError:
        raise RedisUnavailable("the redis client is not installed (pip install 'tokenops[redis]')") from None
    if binary is None:
        raise RedisUnavailable("no redis-server binary (make redis, or apt-get install -y redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {port}") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
