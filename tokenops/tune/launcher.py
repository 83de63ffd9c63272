"""Launch the bundled engine (``tokenops serve``) as a subprocess on a free
loopback port with candidate engine settings, for restart-only tunables.

Engine tunables go in as ``TOKENOPS_ENGINE__<NAME>`` variables; the launched
server gets its own admin key and a scratch store so it never contends with the
user's store file.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tokenops.tune.target import TuneError

_SECTIONS = ("engine", "gateway")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(params: dict[str, Any]) -> dict[str, str]:
    """``{"engine.block_size": 32}`` -> ``{"TOKENOPS_ENGINE__BLOCK_SIZE": "32"}``."""
    env = {}
    for name, value in params.items():
        section, _, key = name.partition(".")
        if section not in _SECTIONS or not key:
            raise TuneError(f"{name} needs a restart but is not an engine or gateway setting; tokenops cannot launch with it")
        env[f"TOKENOPS_{section.upper()}__{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def can_launch_with(name: str) -> bool:
    section, _, key = name.partition(".")
    return section in _SECTIONS and bool(key)


class LaunchedServer:
    """One ``tokenops serve`` process; :meth:`start` waits until ``/ready``."""

    def __init__(self, params: dict[str, Any], model: str | None = None, config: str | None = None,
                 ready_timeout_s: float = 600.0) -> None:
        self.params = dict(params)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_key = secrets.token_hex(16)
        self.workdir = Path(tempfile.mkdtemp(prefix="tokenops-tune-"))
        self.log_path = self.workdir / "serve.log"
        self.model = model
        self.config = config
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen | None = None

    def _config_file(self) -> str | None:
        if self.model is None:
            return self.config
        name = Path(self.model).name or "model"
        path = self.workdir / "tokenops.toml"
        path.write_text(f'[[models]]\nname = "{name}"\nbackend = "local"\npath = "{Path(self.model).resolve()}"\n')
        return str(path)

    def start(self) -> "LaunchedServer":
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENOPS_ENGINE__", "TOKENOPS_GATEWAY__"))}
        env.update(env_for(self.params))
        env.update({"TOKENOPS_GATEWAY__HOST": "127.0.0.1", "TOKENOPS_GATEWAY__PORT": str(self.port),
                    "TOKENOPS_ADMIN_KEY": self.admin_key, "TOKENOPS_STORE": str(self.workdir / "store.duckdb")})
        env.pop("TOKENOPS_CONFIG", None)
        cfg = self._config_file()
        if cfg:
            env["TOKENOPS_CONFIG"] = cfg
        cmd = [sys.executable, "-c", "import sys; from tokenops.cli import main; main(sys.argv[1:])", "serve"]
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + self.ready_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise TuneError(f"tokenops serve exited with code {self.proc.returncode}: {self._tail()}")
                try:
                    if client.get(f"{self.url}/ready").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        self.stop()
        raise TuneError(f"tokenops serve was not ready after {self.ready_timeout_s:.0f}s: {self._tail()}")

    def _tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-3:]) or "(empty log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
