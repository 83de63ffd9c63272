"""The ``tokenops`` command bounds libgomp's barrier spin (``GOMP_SPINCOUNT``, default
``DEFAULT_SPINS``, ``TOKENOPS_OMP_SPIN`` to change it) before torch loads (tokenops/engine/kernels/openmp_wait.py),
and serve builds its engine on the thread that steps it (one OpenMP pool)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tokenops.engine.kernels.openmp_wait import DEFAULT_SPINS, SPIN_ENV, apply_spin_setting


def test_spin_default_its_override_and_the_users_own_variables_win():
    env: dict[str, str] = {}
    assert apply_spin_setting(env) and env == {"GOMP_SPINCOUNT": str(DEFAULT_SPINS)}
    env = {SPIN_ENV: "0"}
    assert not apply_spin_setting(env) and env == {SPIN_ENV: "0"}
    env = {SPIN_ENV: "300"}
    assert apply_spin_setting(env)
    assert env == {SPIN_ENV: "300", "GOMP_SPINCOUNT": "300"}
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
    assert "GOMP_SPINCOUNT" not in os.environ


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


def test_serve_sets_the_spin_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", SPIN_ENV)}
    assert _serve_probe(env) == ["None", str(DEFAULT_SPINS), "False"]
    assert _serve_probe({**env, SPIN_ENV: "300"}) == ["None", "300", "False"]
    assert _serve_probe({**env, SPIN_ENV: "0"}) == ["None", "None", "False"]


def test_the_engine_is_built_and_stepped_on_one_thread(tiny_checkpoint):
    """``build_on_engine_thread`` runs the factory on the thread that then runs the steps (one OpenMP
    pool; two made libgomp throttle every barrier) and answers; a failing build raises to the caller."""
    import asyncio
    import threading

    from tokenops.engine.core.async_engine import AsyncLLMEngine
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams

    built_on: list[threading.Thread] = []

    def factory() -> LLMEngine:
        built_on.append(threading.current_thread())
        return LLMEngine(EngineConfig(model=str(tiny_checkpoint("llama")), kv_cache_tokens=512))

    engine = AsyncLLMEngine.build_on_engine_thread(factory)
    try:
        assert built_on == [engine._thread] and built_on[0] is not threading.current_thread()

        async def ask() -> int:
            made = 0
            params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
            async for out in engine.generate([5, 6, 7], params):
                made += len(out.outputs[0].delta_token_ids) if out.outputs else 0
            return made

        assert asyncio.run(ask()) == 4
        assert engine._thread is built_on[0] and engine.is_running
    finally:
        engine.shutdown()

    def broken() -> LLMEngine:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        AsyncLLMEngine.build_on_engine_thread(broken)


def test_programs_other_than_tokenops_do_not_inherit_the_commands_spin(monkeypatch):
    import tokenops.engine.kernels.openmp_wait as openmp_wait
    from tokenops.tune.launcher import CommandLineLauncher, Launcher, TokenopsLauncher

    monkeypatch.delenv(SPIN_ENV, raising=False)
    monkeypatch.setenv("GOMP_SPINCOUNT", str(DEFAULT_SPINS))
    monkeypatch.setattr(openmp_wait, "_set_for_this_process", True)  # as the tokenops command leaves it
    assert "GOMP_SPINCOUNT" not in openmp_wait.environ_for_other_programs()
    assert issubclass(CommandLineLauncher, Launcher) and "environment" not in vars(CommandLineLauncher)
    assert "GOMP_SPINCOUNT" not in Launcher().environment({}, None)  # vLLM, llama.cpp, SGLang launchers
    assert "environment" in vars(TokenopsLauncher)  # a tokenops child keeps its own setting
    monkeypatch.setenv("GOMP_SPINCOUNT", "5000")  # the user's own value is not the command's: kept
    assert openmp_wait.environ_for_other_programs()["GOMP_SPINCOUNT"] == "5000"
    monkeypatch.setattr(openmp_wait, "_set_for_this_process", False)
    monkeypatch.setenv("GOMP_SPINCOUNT", str(DEFAULT_SPINS))  # set by the user before tokenops started
    assert openmp_wait.environ_for_other_programs()["GOMP_SPINCOUNT"] == str(DEFAULT_SPINS)
