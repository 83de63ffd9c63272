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
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ADMIN_KEY = "serve-test-admin-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """``tokenops serve`` in a subprocess; ``url`` is its root, ``base_url`` its ``/v1``."""

    def __init__(self, workdir: Path | str, *, config: str | None = None, args: list[str] | tuple[str, ...] = (),
                 env: dict[str, str] | None = None, store: bool = True, ready_timeout_s: float = 180.0,
                 admin_key: str = ADMIN_KEY) -> None:
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

    def start(self) -> "ServeProcess":
        import httpx

        env = dict(os.environ, TOKENOPS_ADMIN_KEY=self.admin_key, **self._env)
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.command(), cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     text=True)
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

    def __enter__(self) -> "ServeProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
