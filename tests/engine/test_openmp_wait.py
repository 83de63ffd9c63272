"""``tokenops serve`` bounds libgomp's barrier spin before torch loads (tokenops/engine/openmp_wait.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tokenops.engine.openmp_wait import SPIN_COUNT, prefer_short_spin


def test_prefer_short_spin_sets_the_bounded_spin_unless_the_user_chose():
    env: dict[str, str] = {}
    assert prefer_short_spin(env)
    assert env == {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": str(SPIN_COUNT)}
    for mine in ({"OMP_WAIT_POLICY": "passive"}, {"GOMP_SPINCOUNT": "300000"}):
        env = dict(mine)
        assert not prefer_short_spin(env)
        assert env == mine


def test_prefer_short_spin_leaves_a_process_whose_libgomp_is_loaded():
    # torch is loaded in this test process: libgomp read its environment already
    import torch  # noqa: F401

    before = dict(os.environ)
    assert not prefer_short_spin()
    assert dict(os.environ) == before


def test_serve_sets_it_before_torch_loads():
    """The real ``tokenops serve`` command up to the server start (replaced by a probe that reports
    the environment and whether torch was loaded by then), in a fresh interpreter."""
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
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["active", str(SPIN_COUNT), "False"], out.stdout
    env["OMP_WAIT_POLICY"] = "passive"  # the user's choice stays
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split()[-3:] == ["passive", "None", "False"], out.stdout + out.stderr[-2000:]
