"""The one plugin manager: built-ins and third-party plugins from the ``tokenops``
entry-point group, plus local plugin files (``--plugin PATH`` / ``TOKENOPS_PLUGINS``).

Environment:

- ``TOKENOPS_LOAD_PLUGINS``: comma-separated allow-list of entry-point names to load
  (empty string loads none) besides :data:`DEFAULT_PLUGINS`, which always load; unset loads all.
- ``TOKENOPS_PLUGINS``: comma- or ``os.pathsep``-separated ``.py`` files to load.
- ``TOKENOPS_TRACE_PLUGINS``: print every hook call and result to stderr.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from tokenops import decision_keys, hookspecs
from tokenops.blocking import MAY_BLOCK_HOOKS, blocking_mark
from tokenops.config import GatewaySettings, replaceable_plugins
from tokenops.engine.core.config import engine_tunables
from tokenops.plugin_sets import Listing, PluginSet, active, trace_if_asked
from tokenops.tunables import Tunable, TunableRegistry, gateway_tunables

ENTRY_POINT_GROUP = "tokenops"

#: Built-in plugins loaded whatever ``TOKENOPS_LOAD_PLUGINS`` says (as llm's default plugins):
#: with them a server answers on its own — backend kinds, routing by the requested model name,
#: round-robin replicas and the DuckDB telemetry sink. The bundled engine's own defaults
#: (fcfs/priority, ngram/draft, sink + window) and its tunables (:func:`engine_tunables`) need no plugin.
DEFAULT_PLUGINS = frozenset({"default_backends", "route_by_name", "round_robin", "duckdb_sink"})


class PluginLoadError(RuntimeError):
    """A plugin could not be loaded; the message names the plugin and the reason."""


@dataclass(slots=True)
class PluginInfo:
    name: str
    version: str | None
    layer: str
    hooks: list[str]
    source: str  # "builtin", "entry-point", "file"
    tunables: list[str] = field(default_factory=list)
    launchers: list[str] = field(default_factory=list)


_lock = threading.RLock()
_pm: pluggy.PluginManager | None = None
_sources: dict[str, tuple[str, str | None, Any]] = {}  # name -> (source, version, plugin obj)
_tunables: TunableRegistry | None = None
_extra_files: list[str] = []
_classes: dict[str, type] = {}  # name -> class of a class plugin (each plugin set makes its own instance)
_generation = 0  # bumped by every change of the plugins (_reset_tunables)


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("tokenops")
    pm.add_hookspecs(hookspecs)
    return pm


def _check(pm: pluggy.PluginManager, name: str, plugin: Any) -> None:
    """Reject hook implementations with unknown names or arguments, in one line."""
    for attr in dir(plugin):
        if not attr.startswith("tokenops_"):
            continue
        impl = getattr(plugin, attr)
        if not callable(impl):
            continue
        spec_caller = getattr(pm.hook, attr, None)
        if spec_caller is None or spec_caller.spec is None:
            raise PluginLoadError(f"plugin {name!r} implements unknown hook {attr!r}; see docs/hooks.md")
        allowed, names = set(spec_caller.spec.argnames), ", ".join(spec_caller.spec.argnames)
        mark = blocking_mark(impl)
        if mark is not None and attr not in MAY_BLOCK_HOOKS:
            movable = ", ".join(sorted(MAY_BLOCK_HOOKS))
            raise PluginLoadError(
                f"plugin {name!r} marks {attr!r} @may_block, but only {movable} can move off the "
                "event loop; see docs/hooks.md"
            )
        if mark is not None and mark.argnames is not None and not set(mark.argnames) <= allowed | {"self"}:
            unknown = ", ".join(sorted(set(mark.argnames) - allowed - {"self"}))
            raise PluginLoadError(
                f"plugin {name!r} hook {attr!r}: the @may_block(when=...) predicate takes {unknown}; allowed: {names}"
            )
        extra = [p for p in inspect.signature(impl).parameters if p != "self" and p not in allowed]
        if extra:
            raise PluginLoadError(
                f"plugin {name!r} hook {attr!r} takes unknown argument(s) {', '.join(extra)}; allowed: {names}"
            )


def _register(pm: pluggy.PluginManager, plugin: Any, name: str, source: str, version: str | None) -> None:
    if inspect.isclass(plugin):  # a plugin class: its instances carry their config (docs/plugins.md)
        _classes[name], plugin = plugin, plugin()
    _check(pm, name, plugin)
    try:
        decision_keys.declare_plugin(name, plugin)  # its decision keys (tokenops_register_decisions)
        pm.register(plugin, name=name)
    except (pluggy.PluginValidationError, decision_keys.DecisionError) as e:
        decision_keys.forget(name)
        raise PluginLoadError(f"plugin {name!r} failed to load: {e}") from None
    _sources[name] = (source, version, plugin)


def _load_file(pm: pluggy.PluginManager, path: str) -> None:
    p = Path(path).expanduser()
    if not p.is_file():
        raise PluginLoadError(f"plugin file {path} does not exist")
    name = f"file:{p.stem}"
    if pm.has_plugin(name):
        return
    spec = importlib.util.spec_from_file_location(f"tokenops_local_plugin_{p.stem}", p)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a broken user file must name itself
        raise PluginLoadError(f"plugin file {path} failed to import: {type(e).__name__}: {e}") from None
    _register(pm, module, name, "file", None)


def _is_builtin(ep: importlib.metadata.EntryPoint) -> bool:
    return ep.value.startswith("tokenops_plugins.")


def _dist_name(ep: importlib.metadata.EntryPoint) -> str:
    name = (ep.dist.metadata["Name"] if ep.dist is not None else None) or ""
    return name.lower().replace("_", "-")


def replacements() -> set[str]:
    """Built-in names another plugin may take: ``TOKENOPS_REPLACE_PLUGINS`` (comma-separated), ``[plugins]
    replace`` of tokenops.toml (read here: plugins load before settings) and :func:`allow_replacing`."""
    names = {s.strip() for s in os.environ.get("TOKENOPS_REPLACE_PLUGINS", "").split(",") if s.strip()}
    path = os.environ.get("TOKENOPS_CONFIG") or "tokenops.toml"
    try:
        import tomllib

        configured = tomllib.loads(Path(path).read_text()).get("plugins", {}).get("replace", [])
    except (OSError, ValueError, AttributeError):  # no file or a broken one: load_settings says what is wrong
        configured = []
    if isinstance(configured, list):
        names |= {n for n in configured if isinstance(n, str)}
    return names | replaceable_plugins


def allow_replacing(names: list[str]) -> None:
    """Let a plugin take each built-in name in ``names`` (``[plugins] replace``)."""
    with _lock:
        replaceable_plugins.update(names)


def _chosen_entry_points() -> list[importlib.metadata.EntryPoint]:
    """One entry point per name. A name held by a built-in and by another distribution's
    entry point (or a plugin file of that name) is refused with one line unless the
    operator named it in :func:`replacements`; then the other one replaces the built-in.
    The same entry point seen twice (one distribution on ``sys.path`` twice, as in an
    editable install beside a build) is one entry point, not a clash."""
    by_name: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        same = by_name.setdefault(ep.name, [])
        if not any(e.value == ep.value and _dist_name(e) == _dist_name(ep) for e in same):
            same.append(ep)
    allowed = replacements()
    files = {Path(p).stem: p for p in _file_paths()}
    chosen = []
    for name, eps in by_name.items():
        builtin = [e for e in eps if _is_builtin(e)]
        others = [e for e in eps if not _is_builtin(e)]
        claimants = [f"{e.value} ({_dist_name(e) or 'unknown distribution'})" for e in others]
        if builtin and name in files:
            claimants.append(f"the plugin file {files[name]}")
        if builtin and claimants:
            if name not in allowed:
                raise PluginLoadError(
                    f"plugin name {name!r} is the built-in {builtin[0].value} but is also claimed by "
                    f"{', '.join(claimants)}; to let it replace the built-in, name it in tokenops.toml "
                    f'([plugins] replace = ["{name}"]) or TOKENOPS_REPLACE_PLUGINS={name}'
                )
            if others:
                chosen.append(others[0])
            continue  # a plugin file of that name loads as the file; the built-in stays out
        chosen.append(eps[0])
    return chosen


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    allow_env = os.environ.get("TOKENOPS_LOAD_PLUGINS")
    allow = None if allow_env is None else {s.strip() for s in allow_env.split(",") if s.strip()}
    for ep in _chosen_entry_points():
        is_default = ep.name in DEFAULT_PLUGINS and _is_builtin(ep)
        if allow is not None and ep.name not in allow and not is_default:
            continue
        if pm.has_plugin(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as e:
            raise PluginLoadError(
                f"plugin {ep.name!r} ({ep.value}) failed to import: {type(e).__name__}: {e}"
            ) from None
        dist = ep.dist
        source = "builtin" if ep.value.startswith("tokenops_plugins.") else "entry-point"
        _register(pm, plugin, ep.name, source, dist.version if dist else None)


def _file_paths() -> list[str]:
    env = os.environ.get("TOKENOPS_PLUGINS", "")
    paths = [s for part in env.split(",") for s in part.split(os.pathsep) if s.strip()]
    return paths + _extra_files


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, loaded lazily once."""
    global _pm
    with _lock:
        if _pm is None:
            pm = _new_manager()
            _load_entry_points(pm)
            for path in _file_paths():
                _load_file(pm, path)
            trace_if_asked(pm)
            _pm = pm
        return _pm


def hook() -> Any:
    """The hooks of the running gateway's plugin set (:mod:`tokenops.plugin_sets`), else the manager's."""
    return (active() or get_plugin_manager()).hook


def get_plugin(name: str) -> Any:
    """The plugin object of that name the running gateway uses (its own instance of a class plugin)."""
    return (active() or get_plugin_manager()).get_plugin(name)


def _listing() -> tuple[int, Listing]:
    with _lock:
        return _generation, [(n, p, _classes.get(n)) for n, p in get_plugin_manager().list_name_plugin()]


def new_plugin_set() -> PluginSet:
    """A gateway's own plugin set: fresh instances of the class plugins, module plugins shared."""
    return PluginSet(_listing, lambda: _generation)


def add_plugin_file(path: str) -> None:
    """Load a local plugin file (the CLI's ``--plugin PATH``)."""
    with _lock:
        if path not in _extra_files:
            _extra_files.append(path)
        if _pm is not None:
            _load_file(_pm, path)
            _reset_tunables()


def register_plugin(plugin: Any, name: str | None = None) -> str:
    """Register an in-process plugin object (tests, embedding applications)."""
    pm = get_plugin_manager()
    name = name or getattr(plugin, "__name__", None) or f"plugin-{id(plugin)}"
    with _lock:
        _register(pm, plugin, name, "runtime", None)
        _reset_tunables()
    return name


def unregister_plugin(name: str) -> None:
    pm = get_plugin_manager()
    with _lock:
        if pm.has_plugin(name):
            pm.unregister(name=name)
        _sources.pop(name, None)
        _classes.pop(name, None)
        decision_keys.forget(name)
        _reset_tunables()


def reset() -> None:
    """Forget the loaded plugin manager (tests that change the environment)."""
    global _pm
    with _lock:
        _pm = None
        _sources.clear()
        _classes.clear()
        decision_keys.forget()
        _extra_files.clear()
        replaceable_plugins.clear()
        _reset_tunables()


def _reset_tunables() -> None:  # after any change of the plugins: plugin sets re-mirror too
    global _tunables, _generation
    _tunables = None
    _generation += 1


#: The owner the registry gives the bundled engine's tunables (no plugin: the core declares them).
ENGINE_TUNABLES_OWNER = "engine"
#: The owner of the ``gateway.*`` tunables (``[gateway]`` settings the gateway applies live).
GATEWAY_TUNABLES_OWNER = "gateway"


def get_tunables() -> TunableRegistry:
    """The tunables registry, filled once: the bundled engine's own, then what plugins declare
    through ``tokenops_register_tunables``."""
    global _tunables
    pm = get_plugin_manager()
    with _lock:
        if _tunables is None:
            registry = TunableRegistry()
            # the engine declares its own (EngineConfig's field metadata): no plugin carries them here;
            # engine.schedule_policy also takes the queue orders plugins register (names only)
            orders: list[str] = []
            for order_impl in pm.hook.tokenops_register_schedule_orders.get_hookimpls():
                order_impl.function(register=lambda name, order: orders.append(name))
            for tunable in engine_tunables(orders):
                registry.register(tunable, plugin=ENGINE_TUNABLES_OWNER)
            for tunable in gateway_tunables(GatewaySettings()):  # [gateway] admission and drain
                registry.register(tunable, plugin=GATEWAY_TUNABLES_OWNER)
            for impl in pm.hook.tokenops_register_tunables.get_hookimpls():
                owner = impl.plugin_name

                def register(t: Tunable, _owner: str = owner) -> None:
                    registry.register(t, plugin=_owner)

                impl.function(register=register)
            _tunables = registry
        return _tunables


def _launcher_entries() -> dict[str, tuple[str, Any]]:
    """Launcher name -> (owning plugin, factory), from ``tokenops_register_launchers``."""
    pm = get_plugin_manager()
    found: dict[str, tuple[str, Any]] = {}
    for impl in pm.hook.tokenops_register_launchers.get_hookimpls():

        def register(name: str, factory: Any, _owner: str = impl.plugin_name) -> None:
            if name in found:
                raise PluginLoadError(f"launcher {name!r} is registered twice ({found[name][0]} and {_owner})")
            found[name] = (_owner, factory)

        impl.function(register=register)
    return found


def get_launchers() -> dict[str, Any]:
    """Launcher name -> factory (``factory(LaunchOptions) -> Launcher``) for ``tokenops tune --launch``."""
    return {name: factory for name, (_, factory) in sorted(_launcher_entries().items())}


def get_workloads() -> dict[str, Any]:
    """Benchmark workload name -> factory, as the plugins register them
    (``tokenops_register_workloads``); the same name twice is a ``WorkloadError``."""
    from tokenops.bench.workloads import WorkloadError

    found: dict[str, Any] = {}

    def register(name: str, factory: Any) -> None:
        if name in found:
            raise WorkloadError(f"workload {name!r} is registered twice")
        found[name] = factory

    get_plugin_manager().hook.tokenops_register_workloads(register=register)
    return found


def _layer_of(plugin: Any, hooks: list[str]) -> str:
    declared = getattr(plugin, "TOKENOPS_LAYER", None)
    if declared:
        return declared
    layers = [hookspecs.HOOK_LAYERS.get(h, "setup") for h in hooks]
    for layer in hookspecs.LAYERS[1:5]:  # the four technique layers take precedence
        if layer in layers:
            return layer
    return layers[0] if layers else "setup"


def list_plugins() -> list[PluginInfo]:
    """Every loaded plugin with its layer, version, hooks, tunables and launchers."""
    pm = get_plugin_manager()
    registry = get_tunables()
    launchers_by_name = _launcher_entries()
    out = []
    for name, plugin in pm.list_name_plugin():
        source, version, _ = _sources.get(name, ("runtime", None, plugin))
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        tunables = [t.name for t in registry if t.plugin == name]
        launchers = sorted(n for n, (owner, _) in launchers_by_name.items() if owner == name)
        out.append(PluginInfo(name, version, _layer_of(plugin, hooks), hooks, source, tunables, launchers))
    return sorted(out, key=lambda p: (hookspecs.LAYERS.index(p.layer) if p.layer in hookspecs.LAYERS else 99, p.name))
