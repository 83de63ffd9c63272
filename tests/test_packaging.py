"""pyproject.toml lists every package folder and every built-in plugin module."""

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package_dirs():
    for base, name in (("tokenops", "tokenops"), ("tokenops_plugins", "tokenops_plugins")):
        for init in (ROOT / base).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / base)
            yield ".".join([name, *rel.parts]) if rel.parts else name


def test_every_package_folder_is_listed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    missing = sorted(set(_package_dirs()) - listed)
    assert not missing, f"add to [tool.setuptools] packages: {missing}"


def test_every_builtin_plugin_module_is_an_entry_point():
    entry_points = set(PYPROJECT["project"]["entry-points"]["tokenops"].values())
    targets = {ep.partition(":")[0] for ep in entry_points}  # "module" or "module:PluginClass" (docs/plugins.md)
    modules = set()
    for path in (ROOT / "tokenops_plugins").rglob("*.py"):
        if path.name.startswith("_"):  # __init__ and private helper modules are not plugins
            continue
        rel = path.relative_to(ROOT / "tokenops_plugins").with_suffix("")
        modules.add(".".join(["tokenops_plugins", *rel.parts]))
    assert modules - targets == set(), "register these plugin modules under [project.entry-points.tokenops]"
    for ep in entry_points:
        module, _, attr = ep.partition(":")
        loaded = importlib.import_module(module)
        assert not attr or isinstance(getattr(loaded, attr), type), f"{ep}: an entry point names a module or a class"
