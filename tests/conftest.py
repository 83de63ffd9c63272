"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

#: The suite's default model: the in-repo toy (``tokenops-demo``), so that every test that starts an
#: engine or ``tokenops serve`` without naming a model stays fast. Set before any test runs, so
#: ``ServeProcess`` children inherit it. Tests of the real embedded default (SmolLM2) clear it:
#: ``ServeProcess(..., env=REAL_DEFAULT_ENV)`` or ``monkeypatch.delenv(DEFAULT_MODEL_ENV)``.
DEFAULT_MODEL_ENV = "TOKENOPS_DEFAULT_MODEL"
TOY_DEFAULT_MODEL = "tokenops-demo"
os.environ[DEFAULT_MODEL_ENV] = TOY_DEFAULT_MODEL


@pytest.fixture(scope="session")
def install_example(tmp_path_factory):
    """``install_example(name)``: pip-install ``examples/<name>`` (as a third party would, from its own
    folder) into a fresh target directory and return that directory, for ``PYTHONPATH``."""

    def install(name: str) -> str:
        target = tmp_path_factory.mktemp("site")
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
               str(target), str(EXAMPLES / name)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return str(target)

    return install
