"""Launch an inference server as a subprocess on a free loopback port with
candidate settings, for restart-only tunables.

A :class:`Launcher` knows one server kind: its name, the tunable prefixes it owns
(``vllm.``), how a configuration becomes a command line and environment, and
which paths answer 200 once it serves. Launchers come from the
``tokenops_register_launchers`` hook (:func:`tokenops.plugin_manager.get_launchers`);
the bundled engine's is :class:`TokenopsLauncher`: engine and gateway tunables go
in as ``TOKENOPS_ENGINE__<NAME>`` variables, and the server gets its own admin
key and a scratch store so it never contends with the user's store file.
:class:`CommandLineLauncher` maps tunables to flags from a :class:`Flag` table,
which is all a launcher for vLLM, SGLang or a similar server has to declare.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tokenops.tunables import Tunable
from tokenops.tune.errors import TuneError

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
            raise TuneError(
                f"{name} needs a restart but is not an engine or gateway setting; tokenops cannot launch with it"
            )
        env[f"TOKENOPS_{section.upper()}__{key.upper()}"] = (
            str(value).lower() if isinstance(value, bool) else str(value)
        )
    return env


def can_launch_with(name: str) -> bool:
    section, _, key = name.partition(".")
    return section in _SECTIONS and bool(key)


@dataclass(slots=True)
class LaunchOptions:
    """What the user said about the server to launch (``tokenops tune --launch ...``)."""

    #: Model to serve: a local folder or a hub id (the bundled engine: a local folder or None for the demo).
    model: str | None = None
    #: Replaces the launcher's program, e.g. ``"/opt/vllm/bin/vllm serve"`` (shell-style quoting).
    command: str | None = None
    #: Passed through after the mapped flags, e.g. ``["--tensor-parallel-size", "2"]``.
    extra_args: list[str] = field(default_factory=list)
    ready_timeout_s: float = 600.0
    #: The bundled engine only: a ``tokenops.toml`` to serve with.
    config: str | None = None


class ServerProcess:
    """One launched server; :meth:`start` waits until every ready path answers 200."""

    def __init__(
        self,
        name: str,
        params: dict[str, Any],
        ready_paths: tuple[str, ...] = ("/health", "/v1/models"),
        ready_timeout_s: float = 600.0,
        admin_key: str | None = None,
    ) -> None:
        self.name = name
        self.params = dict(params)
        self.ready_paths = ready_paths
        self.ready_timeout_s = ready_timeout_s
        self.admin_key = admin_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"tokenops-tune-{name}-"))
        self.log_path = self.workdir / "serve.log"
        self.argv: list[str] = []
        self.env: dict[str, str] | None = None
        self.cwd: Path | None = None
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        assert self.argv, "set argv before start()"
        log = open(self.log_path, "wb")  # noqa: SIM115 (the server writes it for its whole life)
        try:
            # its own session, so stop() reaches the workers a server forks (vLLM's engine core, SGLang's scheduler)
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, start_new_session=True
            )
        except OSError as e:
            raise TuneError(f"cannot start {self.name}: {shlex.join(self.argv[:3])}: {e.strerror or e}") from None
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:  # a failed or interrupted start leaves nothing running
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        import httpx

        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        pending = list(self.ready_paths)
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise TuneError(
                        f"{self.name} exited with code {self.proc.returncode} before it was ready: {self.tail()}"
                    )
                try:
                    while pending and client.get(f"{self.url}{pending[0]}").status_code == 200:
                        pending.pop(0)
                except httpx.HTTPError:
                    pass
                if not pending:
                    return
                time.sleep(0.5)
        raise TuneError(
            f"{self.name} was not ready after {self.ready_timeout_s:.0f}s "
            f"(waiting for {' and '.join(self.ready_paths)}): {self.tail()}"
        )

    def tail(self, num_lines: int = 3) -> str:
        """The log's last lines on one line, and where the whole log is."""
        try:
            lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "(no log)"
        text = " | ".join(lines[-num_lines:]) or "(empty log)"
        return f"{text[-600:]} (log: {self.log_path})"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)
        # workers outlive their parent for a moment; the next launch needs their GPU memory and port
        deadline = time.monotonic() + 15
        while _group_alive(proc) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _group_alive(proc):
            _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(proc: subprocess.Popen) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class Launcher:
    """One kind of server that ``tokenops tune --launch --engine NAME`` can start.

    Subclasses set the class attributes and implement :meth:`command`; a factory
    registered through ``tokenops_register_launchers`` is called with the
    :class:`LaunchOptions` and returns an instance.
    """

    name: ClassVar[str] = ""
    #: Tunables whose names start with one of these are this launcher's (``("vllm.",)``).
    prefixes: ClassVar[tuple[str, ...]] = ()
    #: Paths that must answer 200, in order, before the server is measured.
    ready_paths: ClassVar[tuple[str, ...]] = ("/health", "/v1/models")
    #: Whether the server has tokenops' admin API, so live tunables can be patched without a relaunch.
    has_admin_api: ClassVar[bool] = False

    def __init__(self, options: LaunchOptions | None = None) -> None:
        self.options = options or LaunchOptions()

    def owns(self, tunable_name: str) -> bool:
        return tunable_name.startswith(self.prefixes)

    def check(self) -> None:
        """Raise :class:`TuneError` when the server cannot be launched at all (not installed, no model)."""

    def command(self, params: dict[str, Any], server: ServerProcess) -> list[str]:
        """The argv that serves ``params`` on ``127.0.0.1:server.port``."""
        raise NotImplementedError

    def environment(self, params: dict[str, Any], server: ServerProcess) -> dict[str, str]:
        """The server's whole environment: this process's, less the barrier spin the ``tokenops``
        command set for its own engine (:func:`~tokenops.engine.kernels.openmp_wait.environ_for_other_programs`)."""
        from tokenops.engine.kernels.openmp_wait import environ_for_other_programs

        return environ_for_other_programs()

    def prepare(self, params: dict[str, Any]) -> ServerProcess:
        """The server for ``params`` with its port, command and environment, not started yet."""
        server = ServerProcess(
            self.name,
            params,
            self.ready_paths,
            self.options.ready_timeout_s,
            secrets.token_hex(16) if self.has_admin_api else None,
        )
        server.argv = self.command(params, server)
        server.env = self.environment(params, server)
        return server

    def launch(self, params: dict[str, Any]) -> ServerProcess:
        """Start a server with ``params`` and wait until it is ready."""
        return self.prepare(params).start()

    def program(self, default: list[str], source: str | None, hint: str) -> list[str]:
        """``options.command`` split, else ``default`` (from the variable ``source``, or None
        for the built-in default); either way its executable must exist."""
        argv = shlex.split(self.options.command) if self.options.command else default
        if not argv:
            raise TuneError("--launcher-cmd is empty")
        if shutil.which(argv[0]) is None:
            if self.options.command:
                what = f"the --launcher-cmd program {argv[0]!r} is not an executable"
            elif source:
                what = f"{source}={argv[0]!r} is not an executable"
            else:
                what = f"no {argv[0]!r} executable on PATH"
            raise TuneError(f"{self.name}: {what}; {hint}")
        return argv


class TokenopsLauncher(Launcher):
    """The bundled engine: ``tokenops serve`` with engine/gateway tunables as ``TOKENOPS_*`` variables."""

    name = "tokenops"
    prefixes = ("engine.", "gateway.")
    ready_paths = ("/ready",)
    has_admin_api = True

    def owns(self, tunable_name: str) -> bool:
        return can_launch_with(tunable_name)

    def _config_file(self, workdir: Path) -> str | None:
        model = self.options.model
        if model is None:
            return self.options.config
        name = Path(model).name or "model"
        path = workdir / "tokenops.toml"
        path.write_text(f'[[models]]\nname = "{name}"\nbackend = "local"\npath = "{Path(model).resolve()}"\n')
        return str(path)

    def command(self, params: dict[str, Any], server: ServerProcess) -> list[str]:
        server.cwd = server.workdir
        if self.options.command:
            return [*self.program([], None, "give a command that runs tokenops"), "serve", *self.options.extra_args]
        return [
            sys.executable,
            "-c",
            "import sys; from tokenops.cli import main; main(sys.argv[1:])",
            "serve",
            *self.options.extra_args,
        ]

    def environment(self, params: dict[str, Any], server: ServerProcess) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENOPS_ENGINE__", "TOKENOPS_GATEWAY__"))}
        env.update(env_for(params))
        env.update(
            {
                "TOKENOPS_GATEWAY__HOST": "127.0.0.1",
                "TOKENOPS_GATEWAY__PORT": str(server.port),
                "TOKENOPS_STORE": str(server.workdir / "store.duckdb"),
            }
        )
        if server.admin_key:
            env["TOKENOPS_ADMIN_KEY"] = server.admin_key
        env.pop("TOKENOPS_CONFIG", None)
        cfg = self._config_file(server.workdir)
        if cfg:
            env["TOKENOPS_CONFIG"] = cfg
        return env


# -- tunables -> command-line flags ---------------------------------------------

_KEEP = object()


@dataclass(frozen=True, slots=True)
class Flag:
    """How one tunable reaches a server's command line.

    Values are passed as ``flag VALUE``. A bool passes ``flag`` when true and
    ``false_flag`` (when there is one) when false. A value equal to ``omit`` is
    left out, so the server decides (``0`` for "the model's own length").
    """

    tunable: Tunable
    flag: str
    false_flag: str | None = None
    omit: Any = _KEEP

    def args(self, value: Any) -> list[str]:
        value = self.tunable.validate(value)
        if self.omit is not _KEEP and value == self.omit:
            return []
        if self.tunable.type == "bool":
            chosen = self.flag if value else self.false_flag
            return [chosen] if chosen else []
        return [self.flag, str(value)]


class CommandLineLauncher(Launcher):
    """A launcher whose tunables are command-line flags: declare :attr:`flags`,
    implement :meth:`base_command` (program, model, host and port)."""

    flags: ClassVar[tuple[Flag, ...]] = ()

    def flag_args(self, params: dict[str, Any]) -> list[str]:
        """Every tunable in ``params`` as flags, in the table's order (the search's values, the default included)."""
        table = {f.tunable.name: f for f in self.flags}
        unknown = sorted(set(params) - set(table))
        if unknown:
            raise TuneError(f"the {self.name} launcher has no command-line flag for {', '.join(unknown)}")
        return [a for f in self.flags if f.tunable.name in params for a in f.args(params[f.tunable.name])]

    def base_command(self, server: ServerProcess) -> list[str]:
        raise NotImplementedError

    def command(self, params: dict[str, Any], server: ServerProcess) -> list[str]:
        return [*self.base_command(server), *self.flag_args(params), *self.options.extra_args]

    def model_arg(self) -> str:
        """The model as given, made absolute when it is a local path (a hub id stays as it is)."""
        model = self.options.model
        if not model:
            raise TuneError(f"--engine {self.name} needs --model MODEL (a hub id or a local model folder)")
        return str(Path(model).resolve()) if Path(model).exists() else model


LauncherFactory = Callable[[LaunchOptions], Launcher]


def split_args(items: list[str]) -> list[str]:
    """``--launcher-arg`` values, each split shell-style (``"--tp 2"`` is two arguments)."""
    out = []
    for item in items:
        try:
            out += shlex.split(item)
        except ValueError as e:
            raise TuneError(f"--launcher-arg {item!r}: {e}") from None
    return out
