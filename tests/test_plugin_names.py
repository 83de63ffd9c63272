"""Plugin names (issue 42): an installed package or plugin file that claims a built-in's
name is refused at start with one line, unless the operator names it in configuration;
the same distribution seen twice on ``sys.path`` is no clash."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenops import plugin_manager as plugins

EVIL = "def tokenops_admit(request):\n    return None\n"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    for name in ("TOKENOPS_PLUGINS", "TOKENOPS_LOAD_PLUGINS", "TOKENOPS_REPLACE_PLUGINS", "TOKENOPS_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    plugins.reset()
    try:
        yield tmp_path
    finally:
        plugins.reset()


def _install(site: Path, dist: str, name: str, module: str, body: str = EVIL) -> None:
    """A distribution as pip leaves it: a module and a .dist-info with an entry point."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text("from tokenops import hookimpl\n\n@hookimpl\n" + body)
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[tokenops]\n{name} = {module}\n")


def test_an_installed_package_claiming_a_builtin_name_is_refused(fresh, monkeypatch):
    _install(fresh / "site", "evil-budgets", "key_budgets", "evil_budgets")
    monkeypatch.syspath_prepend(str(fresh / "site"))
    with pytest.raises(plugins.PluginLoadError) as e:
        plugins.get_plugin_manager()
    message = str(e.value)
    assert "\n" not in message and "key_budgets" in message and "evil-budgets" in message
    assert "[plugins] replace" in message and "TOKENOPS_REPLACE_PLUGINS=key_budgets" in message


@pytest.mark.parametrize("how", ["env", "config"])
def test_the_operator_may_let_it_replace_the_builtin(fresh, monkeypatch, how):
    _install(fresh / "site", "evil-budgets", "key_budgets", "evil_budgets")
    monkeypatch.syspath_prepend(str(fresh / "site"))
    if how == "env":
        monkeypatch.setenv("TOKENOPS_REPLACE_PLUGINS", "key_budgets")
    else:
        (fresh / "tokenops.toml").write_text('[plugins]\nreplace = ["key_budgets"]\n')
    info = {p.name: p for p in plugins.list_plugins()}["key_budgets"]
    assert info.source == "entry-point"
    assert plugins.get_plugin_manager().get_plugin("key_budgets").__name__ == "evil_budgets"


def test_the_same_distribution_twice_on_sys_path_is_no_clash(fresh, monkeypatch):
    # an editable install beside a build, or a checkout on PYTHONPATH beside site-packages:
    # every entry point of the tokenops distribution is listed twice
    found = importlib.metadata.entry_points

    def twice(**kw):
        eps = list(found(**kw))
        return eps + [importlib.metadata.EntryPoint(e.name, e.value, e.group)._for(e.dist) for e in eps]

    monkeypatch.setattr(importlib.metadata, "entry_points", twice)
    assert [e.name for e in twice(group="tokenops")].count("key_budgets") == 2
    assert "key_budgets" in {p.name for p in plugins.list_plugins()}  # loaded once, no clash


def test_a_plugin_file_named_like_a_builtin_is_refused_unless_named(fresh, monkeypatch):
    path = fresh / "key_budgets.py"
    path.write_text("from tokenops import hookimpl\n\n@hookimpl\n" + EVIL)
    monkeypatch.setenv("TOKENOPS_PLUGINS", str(path))
    with pytest.raises(plugins.PluginLoadError, match="the plugin file"):
        plugins.get_plugin_manager()
    plugins.reset()
    monkeypatch.setenv("TOKENOPS_REPLACE_PLUGINS", "key_budgets")
    names = {p.name for p in plugins.list_plugins()}
    assert "file:key_budgets" in names and "key_budgets" not in names  # the file replaces the built-in


def test_the_cli_refuses_to_start_with_one_line(tmp_path):
    _install(tmp_path / "site", "evil-budgets", "key_budgets", "evil_budgets")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENOPS_")}
    env["PYTHONPATH"] = str(tmp_path / "site") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "tokenops", "plugins"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0 and "key_budgets" in r.stderr, r.stderr
