"""``TOKENOPS_OMP_SPIN`` bounds libgomp's barrier spin in ``tokenops serve``, set before torch loads
(tokenops/engine/openmp_wait.py); without it nothing changes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tokenops.engine.openmp_wait import SPIN_ENV, apply_spin_setting


def test_spin_setting_is_opt_in_and_the_users_own_variables_win():
    env: dict[str, str] = {}
    assert not apply_spin_setting(env) and env == {}
    env = {SPIN_ENV: "0"}
    assert not apply_spin_setting(env) and env == {SPIN_ENV: "0"}
    env = {SPIN_ENV: "1000"}
    assert apply_spin_setting(env)
    assert env == {SPIN_ENV: "1000", "OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "1000"}
    for mine in ({"OMP_WAIT_POLICY": "passive"}, {"GOMP_SPINCOUNT": "300000"}):
        env = {SPIN_ENV: "1000", **mine}
        assert not apply_spin_setting(env)
        assert env == {SPIN_ENV: "1000", **mine}
    with pytest.raises(ValueError, match=SPIN_ENV):
        apply_spin_setting({SPIN_ENV: "lots"})


def test_spin_setting_leaves_a_process_whose_libgomp_is_loaded(monkeypatch):
    import torch  # noqa: F401  (libgomp read its environment already)

    monkeypatch.setenv(SPIN_ENV, "1000")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert not apply_spin_setting()
    assert "OMP_WAIT_POLICY" not in os.environ


def _serve_probe(env: dict[str, str]) -> list[str]:
    """The real ``tokenops serve`` command up to the server start (replaced by a probe that prints the
    two variables and whether torch was loaded by then), in a fresh interpreter."""
    probe = (
        "import os, sys\n"
        "import tokenops.gateway.server as server\n"
        "def probe(*args, **kwargs):\n"
        "    print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)\n"
        "server.run_server = probe\n"
        "from tokenops.cli import main\n"
        "sys.argv = ['tokenops', 'serve', '--no-store']\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()[-3:]


def test_serve_sets_the_spin_before_torch_loads_only_when_asked():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", SPIN_ENV)}
    assert _serve_probe(env) == ["None", "None", "False"]
    assert _serve_probe({**env, SPIN_ENV: "1000"}) == ["active", "1000", "False"]
