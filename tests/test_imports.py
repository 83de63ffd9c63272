"""The core never imports textual (and the light modules never import torch)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["tokenops.store", "tokenops.config", "tokenops.plugin_manager", "tokenops.engine", "tokenops.gateway"])
def test_core_does_not_import_textual(module):
    code = f"import importlib, sys; importlib.import_module({module!r}); print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("module", ["tokenops.config", "tokenops.plugin_manager", "tokenops.cli"])
def test_light_modules_do_not_import_torch(module):
    code = f"import importlib, sys; importlib.import_module({module!r}); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_building_the_cli_loads_no_torch_or_textual():
    """Every plugin is loaded by build_app(); none may pull torch or textual in at import."""
    code = "import sys, tokenops.cli as c; c.build_app(); print('torch' in sys.modules, 'textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False False"


def test_core_imports_no_private_plugin_module():
    """Core (``tokenops``) may use public plugin modules, never their private ``_`` ones (issue 24)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "tokenops"
    private = re.compile(r"(?:from|import)\s+tokenops_plugins(?:\.\w+)*\.(_\w+)")
    offenders = [f"{path.relative_to(root.parent)}: {m.group(0)}" for path in root.rglob("*.py")
                 for m in private.finditer(path.read_text())]
    assert not offenders, offenders
