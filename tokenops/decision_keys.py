"""The decision keys a request's record may hold and their types: the core's own (the
:class:`~tokenops.request_fields.Decisions` TypedDict) plus those each plugin declares through
``tokenops_register_decisions(register)`` when it is registered, so a built-in plugin and a
third-party one declare theirs alike and the core lists none of theirs.

``GatewayRequest.decide`` calls :func:`check_decision`: a key nobody declared, or a value not of
its declared basic type, is a :class:`DecisionError`."""

from __future__ import annotations

import types
import typing
from typing import Any

from tokenops.request_fields import Decisions


class DecisionError(TypeError):
    """A decision key that nobody declared, or a value of the wrong type."""


def _runtime_types(hint: Any) -> tuple[type, ...]:
    """The basic run-time types of an annotation: ``dict[str, Any]`` and a TypedDict are dict,
    ``float`` takes an int too, ``Any`` anything."""
    if hint is Any:
        return (object,)
    if hint is float:
        return (int, float)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(hint) for t in _runtime_types(arg))
    if hint is type(None):
        return (type(None),)
    if typing.is_typeddict(hint):
        return (dict,)
    return (origin or hint,)


#: the core's keys -> the run-time types their values may have (from :class:`Decisions`' annotations)
CORE_TYPES: dict[str, tuple[type, ...]] = {
    key: _runtime_types(hint) for key, hint in typing.get_type_hints(Decisions).items()
}
#: keys plugins declared -> (their types, the plugins that declared them)
_declared: dict[str, tuple[tuple[type, ...], set[str]]] = {}


def declare(owner: str, key: str, hint: Any) -> None:
    """``owner`` writes decision ``key`` with values of type ``hint`` (an annotation: ``str``,
    ``dict[str, Any]``, ``str | None``, a TypedDict ...). Another plugin may declare the same key
    with the same types; a core key, or a key declared with other types, is refused."""
    if not isinstance(key, str) or not key.isidentifier():
        raise DecisionError(f"plugin {owner!r} declares the decision key {key!r}: a key is a name")
    wanted = _runtime_types(hint)
    if key in CORE_TYPES:
        raise DecisionError(f"plugin {owner!r} declares the decision key {key!r}, which the core owns")
    if key in _declared and set(_declared[key][0]) != set(wanted):
        holders = ", ".join(sorted(_declared[key][1]))
        raise DecisionError(f"plugin {owner!r} declares the decision key {key!r} with another type than {holders}")
    _declared.setdefault(key, (wanted, set()))[1].add(owner)


def declare_plugin(owner: str, plugin: Any) -> None:
    """The keys ``plugin`` declares in its ``tokenops_register_decisions`` (if it has one); all or none."""
    impl = getattr(plugin, "tokenops_register_decisions", None)
    if not callable(impl):
        return
    keys: list[tuple[str, Any]] = []
    impl(register=lambda key, hint: keys.append((key, hint)))
    try:
        for key, hint in keys:
            declare(owner, key, hint)
    except DecisionError:
        forget(owner)
        raise


def forget(owner: str | None = None) -> None:
    """Drop the keys only ``owner`` declared (None: every plugin's)."""
    for key in list(_declared):
        owners = _declared[key][1]
        if owner is None:
            owners.clear()
        owners.discard(owner or "")
        if not owners:
            del _declared[key]


def declared() -> dict[str, tuple[type, ...]]:
    """Every key a request may hold now -> its run-time types (core and plugins)."""
    return {**CORE_TYPES, **{key: found[0] for key, found in _declared.items()}}


def check_decision(key: str, value: object) -> None:
    """Raise :class:`DecisionError` unless ``key`` is declared (by the core or a loaded plugin) and
    ``value`` has its basic type (a bool is no number)."""
    allowed = CORE_TYPES.get(key) or (_declared[key][0] if key in _declared else None)
    if allowed is None:
        raise DecisionError(
            f"decision {key!r} is not declared: the core's keys are tokenops.types.Decisions, a "
            "plugin declares its own in tokenops_register_decisions (docs/hooks.md)"
        )
    is_number_key = (int in allowed or float in allowed) and bool not in allowed
    if not isinstance(value, allowed) or (is_number_key and isinstance(value, bool)):
        names = " | ".join(t.__name__ for t in allowed)
        raise DecisionError(f"decision {key!r} takes {names}, got {type(value).__name__}")
