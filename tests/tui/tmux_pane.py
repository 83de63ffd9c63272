"""A private tmux server for terminal tests: one detached pane running a command, read back as text.

Why ``-D``: a plain ``tmux new-session`` forks a daemon through libc ``daemon()``, which refuses
to start (ENODEV) where ``/dev/null`` is not a character device, as in some sandboxes and
containers; tmux then only says "server exited unexpectedly". ``tmux -D`` runs the server in the
foreground instead, so the test starts it as its own child process and needs no daemon at all.
The server gets its own socket name (``-L``), so the tests never touch a user's tmux, and an
environment chosen by the caller (the pane inherits it from the server, not from the client).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Self


def tmux_available() -> bool:
    return shutil.which("tmux") is not None


class TmuxPane:
    """``with TmuxPane(command, cwd=..., env=...) as pane: pane.text()``; the server ends on exit."""

    def __init__(self, command: str, *, cwd: str, env: Mapping[str, str], width: int = 200, height: int = 50) -> None:
        self.socket = f"tokenops-test-{uuid.uuid4().hex[:10]}"
        self.session = "test"
        self._command, self._cwd, self._size = command, cwd, (width, height)
        self._env = {k: v for k, v in env.items() if k not in ("TMUX", "TMUX_PANE")}
        self._server: subprocess.Popen[bytes] | None = None

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self._env, capture_output=True, text=True,
                              check=check, timeout=30)

    def start(self) -> Self:
        self._server = subprocess.Popen(["tmux", "-L", self.socket, "-D"], env=self._env, cwd=self._cwd,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._new_session()
        except BaseException:
            self.stop()  # no orphan server when the session cannot start
            raise
        return self

    def _new_session(self) -> None:
        assert self._server is not None
        deadline = time.monotonic() + 30
        while True:  # the socket appears once the server listens
            if self._server.poll() is not None:
                raise RuntimeError(f"tmux -D exited with {self._server.returncode}")
            done = self._tmux("new-session", "-d", "-s", self.session, "-c", self._cwd, "-x", str(self._size[0]),
                              "-y", str(self._size[1]), self._command, check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"tmux new-session failed: {done.stderr.strip()}")
            time.sleep(0.1)

    def text(self) -> str:
        """What the pane shows now (plain text, no escapes)."""
        return self._tmux("capture-pane", "-p", "-t", self.session, check=False).stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.session, *keys, check=False)

    def wait_for(self, done: Callable[[str], bool], *, timeout_s: float, what: str,
                 every: Callable[[], None] | None = None) -> str:
        """Polls the pane until ``done(text)``; ``every`` runs between looks (e.g. a key press)."""
        deadline, screen = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            screen = self.text()
            if done(screen):
                return screen
            if every is not None:
                every()
            time.sleep(0.5)
        raise AssertionError(f"the pane never showed {what} in {timeout_s:.0f} s; it shows:\n{screen}")

    def stop(self) -> None:
        if self._server is None:
            return
        self._tmux("kill-server", check=False)
        try:
            self._server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def clean_env(drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without ``drop`` (and tmux's own variables)."""
    return {k: v for k, v in os.environ.items() if k not in drop}
