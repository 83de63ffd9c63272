"""Who hears that a C kernel is being compiled (:func:`tokenops.engine.kernels.native.build_library`).

The first start on a machine compiles the kernels for its CPU (up to minutes on a loaded box);
later starts find them cached. ``tokenops serve`` shows that as a step of its start-up
(:mod:`tokenops.cli.serve_progress`) by adding a listener here; without one the compile is
logged. Kept apart from :mod:`tokenops.engine.kernels.native` so a listener is added without importing torch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("tokenops.engine.kernels.native")

#: ``listener(what, cache_dir)`` is called before a compile; what it returns (a callable) after it.
Listener = Callable[[str, Path], Callable[[], None] | None]

_listeners: list[Listener] = []
_lock = threading.Lock()

#: Library stem (its first word) -> what a person reads.
_WHAT = {
    "paged_decode": "the decode-attention kernel",
    "fused_decode": "the fused decode-step kernels",
    "quant": "the quantized kernels",
    "quant_plain": "the quantized kernels (plain fallback)",
}


def describe(stem: str) -> str:
    """``"the quantized kernels"`` for the library stem ``quant`` (the stem itself when unknown)."""
    if stem in _WHAT:
        return _WHAT[stem]
    base = next((s for s in sorted(_WHAT, key=len, reverse=True) if stem.startswith(s + "_")), None)
    return f"{_WHAT[base]} ({stem})" if base else f"the {stem} kernels"


def add_listener(listener: Listener) -> None:
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


@contextlib.contextmanager
def compiling(stem: str, cache_dir: Path) -> Iterator[None]:
    """Around one compile: tell the listeners (or the log) what is compiled, once, and where it is kept."""
    what = describe(stem)
    with _lock:
        listeners = list(_listeners)
    if not listeners:
        log.info("compiling %s for this CPU (once; cached in %s)", what, cache_dir)
    finish = [_told(listener, what, cache_dir) for listener in listeners]
    try:
        yield
    finally:
        for done in finish:
            if done is not None:
                _told(done)


def _told(call: Callable[..., Any], *args: Any) -> Any:
    """A listener's answer; a display that fails (its stream closed: a CLI runner's, a server's that
    stopped without detaching) never fails the compile it is told about."""
    try:
        return call(*args)
    except Exception:  # noqa: BLE001 (any display error: the kernel still compiles)
        log.debug("a compile listener failed", exc_info=True)
        return None
