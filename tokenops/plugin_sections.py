"""``[plugins.<section>]`` checking: a misspelt section, a key no plugin reads, or a
section for a plugin that is not loaded stops ``serve`` and ``tune`` with one line
naming it and the closest known names — a setting silently ignored leaves a feature
off without a word.

A plugin declares what it reads with a module attribute (the ``TOKENOPS_LAYER``
pattern, so third-party plugins can do the same)::

    TOKENOPS_SETTINGS = {"semantic_cache": ("enabled", "threshold", "ttl_s")}

Several plugins may share a section (the routers share ``[plugins.router]``); the
allowed keys are the union. A loaded plugin that declares nothing owns the section
named after it (its entry-point name, or a ``--plugin`` file's stem) with any keys; a
built-in that declares nothing reads nothing.
"""

from __future__ import annotations

import difflib
import importlib.metadata
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from tokenops.config import ConfigError


@dataclass(slots=True)
class Section:
    """One known ``[plugins.<name>]`` table: who reads it and which keys (None: any)."""

    name: str
    plugins: list[str] = field(default_factory=list)
    keys: set[str] | None = field(default_factory=set)


def known_sections() -> dict[str, Section]:
    """Every ``[plugins.<name>]`` the loaded plugins read, by section name."""
    from tokenops.plugin_manager import get_plugin_manager

    sections: dict[str, Section] = {}
    for plugin_name, plugin in get_plugin_manager().list_name_plugin():
        declared = getattr(plugin, "TOKENOPS_SETTINGS", None)
        # a module plugin, or an instance of a class plugin: where it was written
        origin = plugin.__name__ if isinstance(plugin, ModuleType) else str(getattr(plugin, "__module__", ""))
        if declared is None and origin.startswith("tokenops_plugins."):
            continue  # a built-in that declares nothing reads nothing
        if declared is None:
            own = plugin_name.removeprefix("file:")
            sections.setdefault(own, Section(own)).plugins.append(plugin_name)
            sections[own].keys = None
            continue
        for name, keys in declared.items():
            section = sections.setdefault(name, Section(name))
            section.plugins.append(plugin_name)
            if keys is None or section.keys is None:
                section.keys = None
            else:
                section.keys |= set(keys)
    return sections


def _installed_not_loaded(loaded: set[str]) -> dict[str, str]:
    """Section name -> plugin for installed entry-point plugins that are not loaded."""
    out: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group="tokenops"):
        if ep.name in loaded:
            continue
        out[ep.name] = ep.name
        try:  # the module's declaration, read without registering it
            declared = getattr(ep.load(), "TOKENOPS_SETTINGS", None) or {}
        except Exception:  # a broken plugin is reported when it is loaded, not here
            declared = {}
        for section in declared:
            out.setdefault(section, ep.name)
    return out


def _closest(word: str, names: list[str]) -> str:
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.5)
    close += [n for n in names if n not in close and (word in n or n in word) and len(word) >= 3][: 3 - len(close)]
    return f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(sorted(names))}"


#: Keys of the ``[plugins]`` table itself that the core reads (not plugin sections): ``replace``
#: names the built-ins another installed plugin may take (:func:`tokenops.plugin_manager.replacements`).
CORE_KEYS = {"replace"}


def check_plugin_sections(plugins: dict[str, Any], where: str = "config") -> None:
    """Raise :class:`ConfigError` (one line) for the first section or key nobody reads."""
    if not plugins:
        return
    replace = plugins.get("replace", [])
    if not (isinstance(replace, list) and all(isinstance(n, str) for n in replace)):
        raise ConfigError(f"{where}: [plugins] replace must be a list of plugin names, got {replace!r}")
    plugins = {k: v for k, v in plugins.items() if k not in CORE_KEYS}
    sections = known_sections()
    from tokenops.plugin_manager import get_plugin_manager

    loaded = {name for name, _ in get_plugin_manager().list_name_plugin()}
    for name, value in plugins.items():
        if name not in sections:
            not_loaded = _installed_not_loaded(loaded).get(name)
            if not_loaded is not None:
                raise ConfigError(
                    f"{where}: [plugins.{name}] configures plugin {not_loaded!r}, which is not loaded "
                    f"(TOKENOPS_LOAD_PLUGINS leaves it out); load it or remove the section"
                )
            raise ConfigError(f"{where}: unknown section [plugins.{name}]{_closest(name, list(sections))}")
        keys = sections[name].keys
        if keys is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: [plugins.{name}] must be a table, got {value!r}")
        for key in value:
            if key not in keys:
                raise ConfigError(f"{where}: [plugins.{name}] has unknown key {key!r}{_closest(key, sorted(keys))}")
