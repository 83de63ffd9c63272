"""What ``tokenops serve`` shows while it starts: each model loading, the C kernels compiling
(the first start on a machine; cached after), each model loaded or failed, then ready.

On a terminal (stderr a TTY) a rich progress display; otherwise one plain line per step, so a
log file or a CI job reads the same story. Everything goes to stderr: stdout keeps the lines a
script may read (``tokenops serving ... at URL``).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from tokenops.engine.kernels import compile_notice


class StartProgress:
    """The :class:`tokenops.gateway.core.model_loading.StartReport` of ``tokenops serve`` (also told of
    kernel compiles, from whichever thread builds them)."""

    def __init__(self, stream: TextIO | None = None, is_tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.is_tty = self.stream.isatty() if is_tty is None else is_tty
        self.began = time.monotonic()
        self._progress: Any = None  # rich.progress.Progress while models load on a terminal
        self._tasks: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._is_closed = False
        compile_notice.add_listener(self.compiling)

    # -- the steps ------------------------------------------------------------

    def loading(self, label: str, detail: str) -> None:
        self._begin(label, f"loading {label} ({detail})…")

    def on_demand(self, label: str, detail: str) -> None:
        self._say(f"{label} ({detail}): loads on its first request")

    def loaded(self, label: str, seconds: float, kernels: str = "") -> None:
        """``kernels``: what :func:`tokenops.gateway.core.model_loading.kernels_of` says, shown in brackets."""
        self._end(label, f"loaded {label} in {seconds:.1f} s" + (f" ({kernels})" if kernels else ""))

    def failed(self, label: str, seconds: float) -> None:
        self._end(label, f"{label} failed after {seconds:.1f} s", is_ok=False)

    def compiling(self, what: str, cache_dir: Path) -> Any:
        """A kernel build begins; returns what to call when it ends."""
        key, began = f"compile {what}", time.monotonic()
        self._begin(key, f"compiling {what} for this CPU (once; cached in {_home(cache_dir)})…")
        return lambda: self._end(key, f"compiled {what} in {time.monotonic() - began:.1f} s")

    def ready(self, serving: list[str]) -> None:
        """Every model loaded or failed and the server answers: close the display, say so."""
        self.close()
        self._say(f"ready: {', '.join(serving)} ({time.monotonic() - self.began:.1f} s after start)")

    def close(self) -> None:
        """Stop the display (a kernel compiled later, at a first request, still gets its lines)."""
        with self._lock:
            self._is_closed = True
            if self._progress is not None:
                self._progress.stop()
                self._progress = None
                self._tasks.clear()

    def detach(self) -> None:
        """The server has stopped: hear no more compiles."""
        self.close()
        compile_notice.remove_listener(self.compiling)

    # -- output ---------------------------------------------------------------

    def _say(self, line: str) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.console.print(line, highlight=False, markup=False)
            else:
                print(line, file=self.stream, flush=True)

    def _begin(self, key: str, text: str) -> None:
        if not self.is_tty:
            self._say(text)
            return
        with self._lock:
            if self._is_closed:
                print(text, file=self.stream, flush=True)
                return
            if self._progress is None:
                self._progress = _progress_display(self.stream)
                self._progress.start()
            self._tasks[key] = self._progress.add_task(_escape(text), total=None)

    def _end(self, key: str, text: str, is_ok: bool = True) -> None:
        with self._lock:
            task = self._tasks.pop(key, None)
            if task is not None and self._progress is not None:
                mark = "[green]✓[/]" if is_ok else "[red]✗[/]"
                self._progress.update(task, description=f"{mark} {_escape(text)}", total=1, completed=1)
                return
        self._say(text)


def _progress_display(stream: TextIO) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(finished_text=" "),
        TextColumn("{task.description}"),
        BarColumn(bar_width=20),
        TimeElapsedColumn(),
        console=Console(file=stream),
    )


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _home(path: Path) -> str:
    """``~/.cache/...`` rather than the home folder spelled out."""
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home) :] if text.startswith(home + "/") else text
