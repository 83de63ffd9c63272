"""The event-loop contract of hook implementations: :func:`may_block`.

The gateway calls most per-request hooks on its asyncio event loop, where a blocking
implementation (embedding a text, a model call, a network round trip) stalls every
client. An implementation that may block says so with ``@may_block``; the gateway then
runs that hook's call in a worker thread, and cheap, unmarked implementations pay no
thread hop. See docs/plugins.md ("Blocking work") and the ``Runs on:`` line of each hook
in docs/hooks.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Gateway hooks called on the event loop that move to a worker thread when one of
#: their implementations is marked :func:`may_block` (for the call's arguments).
MAY_BLOCK_HOOKS = frozenset({"tokenops_route", "tokenops_validate", "tokenops_ensemble", "tokenops_cache_store"})


@dataclass(frozen=True, slots=True)
class BlockingMark:
    """What :func:`may_block` leaves on an implementation (``fn.tokenops_may_block``)."""

    when: Callable[..., bool] | None = None
    argnames: tuple[str, ...] | None = None  # None: ``when`` takes **kwargs (every argument)

    def applies(self, kwargs: Mapping[str, Any], plugin: Any = None) -> bool:
        """Whether this call may block; ``plugin``: the instance of a class plugin, handed to a
        predicate that takes ``self`` (a method of the plugin's class)."""
        if self.when is None:
            return True
        if self.argnames is None:
            return bool(self.when(**kwargs))
        given = {"self": plugin, **kwargs}
        return bool(self.when(**{k: given[k] for k in self.argnames if k in given}))


def may_block(impl: F | None = None, *, when: Callable[..., bool] | None = None) -> Any:
    """Mark a hook implementation that may block the thread it runs on (embedding a
    text, a model call, a network round trip).

    The gateway then calls the whole hook (every implementation, in the usual order) in
    a worker thread instead of on the event loop; cheap implementations are left unmarked
    and pay no thread hop. Only the hooks in :data:`MAY_BLOCK_HOOKS` honour the mark; a
    plugin putting it on another hook is refused when it loads.

    ``when`` narrows it to the calls that block: a predicate taking any subset of the
    hook's arguments by name (like an implementation) and returning True when this call
    may block, e.g. ``@may_block(when=lambda request: router_is_active(request))``; in a plugin
    class it may also take ``self`` (the instance: ``when=lambda self: self.is_semantic``). It runs
    on the event loop for every call of the hook, so it must itself be cheap.

    Use as ``@hookimpl`` + ``@may_block`` or ``@may_block(when=...)``, in either order.
    """

    def mark(fn: F) -> F:
        names: tuple[str, ...] | None = None
        if when is not None:
            params = inspect.signature(when).parameters.values()
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                names = tuple(p.name for p in params)
        fn.tokenops_may_block = BlockingMark(when, names)  # type: ignore[attr-defined]
        return fn

    return mark(impl) if impl is not None else mark


def blocking_mark(impl: Callable[..., Any]) -> BlockingMark | None:
    """The :func:`may_block` mark of an implementation (function or bound method), if any."""
    mark = getattr(impl, "tokenops_may_block", None)
    return mark if isinstance(mark, BlockingMark) else None
