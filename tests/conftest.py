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


#: What makes a test module leave the process: it starts ``tokenops serve`` or another program.
_SPAWNS = ("ServeProcess", "subprocess", "Popen", "multiprocessing", "install_example", "run_test(", "redis_server(",
           "postgres_server(")
#: Modules that stay in this process but take seconds each (measured: ``--durations=0`` summed per file):
#: CLI commands that build stores and tunes, the fused C step compiled and run per architecture, model
#: loads, dashboard snapshots (3-25 s each, serially, on the 2-core box).
_SECONDS = {"tests/tune/test_tune_cli.py", "tests/engine/test_fused_decode.py", "tests/keys/test_keys_cli.py",
            "tests/store/test_report_cli.py", "tests/multi_model/test_profile_cli.py",
            "tests/compute_network/test_gateway_layer4.py", "tests/gateway/test_fuzz_api.py",
            "tests/tui/test_snapshots.py", "tests/bench/test_bench_cli.py", "tests/engine/test_gguf_tokenizer.py",
            "tests/engine/test_gguf_header.py", "tests/bench/test_bench_loadgen.py", "tests/keys/test_keys_serve.py",
            "tests/test_demo_models.py", "tests/store/test_store_channel.py",
            "tests/engine/test_quant_kernels_model.py", "tests/keys/test_keys_redis.py",
            # tiny MoE models built with transformers and written as GGUF (~20 s); two real engines (~8 s)
            "tests/engine/test_gguf_moe.py", "tests/gateway/test_two_gateways_engine.py",
            # every packed kernel against the reference, and the model families against transformers (~8 s each)
            "tests/engine/test_quant_kernels.py", "tests/engine/test_models_parity.py"}


def pytest_collection_modifyitems(config, items):
    """Mark ``full_only`` every test of a module that starts a server or another process (or drives
    the Textual app), or is listed in :data:`_SECONDS`: ``make test-fast`` runs the rest, in this
    process, in about a minute; ``make test`` runs all."""
    root = Path(__file__).resolve().parents[1]
    seen: dict[Path, bool] = {}
    for item in items:
        path = Path(str(item.fspath))
        if path not in seen:
            text = path.read_text(errors="replace") if path.suffix == ".py" else ""
            rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
            seen[path] = rel in _SECONDS or any(s in text for s in _SPAWNS)
        if seen[path]:
            item.add_marker(pytest.mark.full_only)


@pytest.fixture(autouse=True)
def _kernel_switches_restored():
    """An engine built in a test hands its kernel switches (quant_exact, native_kernels, ...) to the
    process-wide kernels (tokenops/engine/kernels/switches.py): each test starts from the defaults."""
    from tokenops.engine.kernels import switches

    yield
    if switches.current != switches.KernelSwitches():
        switches.apply(switches.KernelSwitches())
