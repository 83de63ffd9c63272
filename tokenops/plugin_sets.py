"""``PluginSet``: one gateway's own plugins, so two gateways in one process never share plugin config.

The process-wide manager (:mod:`tokenops.plugin_manager`) loads and checks every plugin once. A
plugin whose entry point names a **class** is instantiated there, and again for every plugin set:
each gateway gets fresh instances, configured by its own ``tokenops_configure`` (a historic call
on the set's manager). A plugin that is a **module** (the third-party style, and plugin files) or an
object registered at run time (``register_plugin``) is the same object in every set: its state is
the process's, as before.

A set mirrors the process-wide manager: a plugin registered or unregistered there later (a test's
in-test plugin) joins or leaves every set at its next hook call (one integer compare per call).

:func:`active` is the set of the gateway serving the running request or task (the gateway sets it
around its requests and its background tasks, :meth:`PluginSet.activate`); ``plugin_manager.hook()``
calls through it, and through the process-wide manager outside any gateway (the CLI, tests)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import pluggy

from tokenops import hookspecs

#: (name, the process-wide object, its class when the set makes its own instance, else None)
Listing = list[tuple[str, Any, type | None]]
#: () -> (generation of the process-wide manager, its plugins)
Source = Callable[[], tuple[int, Listing]]
#: () -> the generation alone (cheap: read on every hook call)
Generation = Callable[[], int]

_active: ContextVar[PluginSet | None] = ContextVar("tokenops_plugin_set", default=None)


def active() -> PluginSet | None:
    return _active.get()


def trace_if_asked(pm: pluggy.PluginManager) -> None:
    """Print every hook call and its result to stderr when ``TOKENOPS_TRACE_PLUGINS`` is set."""
    if not os.environ.get("TOKENOPS_TRACE_PLUGINS"):
        return

    def before(hook_name: str, impls: Any, kwargs: Any) -> None:
        names = [i.plugin_name for i in impls]
        print(f"[tokenops hook] {hook_name} -> {names} args={sorted(kwargs)}", file=sys.stderr)

    def after(outcome: Any, hook_name: str, impls: Any, kwargs: Any) -> None:
        exc = outcome.exception
        res = f"raised {exc!r}" if exc else f"= {outcome.get_result()!r}"[:200]
        print(f"[tokenops hook] {hook_name} {res}", file=sys.stderr)

    pm.add_hookcall_monitoring(before, after)


class PluginSet:
    """A pluggy manager holding one gateway's instances of the class plugins (module plugins shared)."""

    def __init__(self, source: Source, generation: Generation) -> None:
        self._source = source
        self._current_generation = generation
        self._pm = pluggy.PluginManager("tokenops")
        self._pm.add_hookspecs(hookspecs)
        trace_if_asked(self._pm)
        self._generation = -1
        #: name -> the process-wide object this set's entry stands for
        self._mirrors: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._sync()

    def _sync(self) -> None:
        if self._current_generation() == self._generation:  # the common case: nothing changed
            return
        generation, listing = self._source()
        with self._lock:
            if generation == self._generation:
                return
            wanted = {name: (plugin, cls) for name, plugin, cls in listing}
            for name in [n for n, obj in self._mirrors.items() if wanted.get(n, (None,))[0] is not obj]:
                self._pm.unregister(name=name)
                del self._mirrors[name]
            for name, (plugin, cls) in wanted.items():
                if name not in self._mirrors:
                    self._pm.register(cls() if cls is not None else plugin, name=name)
                    self._mirrors[name] = plugin
            self._generation = generation

    @property
    def hook(self) -> Any:
        self._sync()
        return self._pm.hook

    @property
    def manager(self) -> pluggy.PluginManager:
        self._sync()
        return self._pm

    def get_plugin(self, name: str) -> Any:
        """This set's plugin object of that name (its own instance for a class plugin), else None."""
        return self.manager.get_plugin(name)

    def configure(self, settings: Any) -> None:
        """``tokenops_configure(settings)`` on this set's plugins (historic: later ones get it too)."""
        self.hook.tokenops_configure.call_historic(kwargs={"settings": settings})

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Hooks called in this block (and in tasks and ``asyncio.to_thread`` calls it starts) reach this set."""
        token = _active.set(self)
        try:
            yield
        finally:
            _active.reset(token)
