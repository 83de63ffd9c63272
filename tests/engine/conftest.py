"""Shared engine fixtures: tiny random HF checkpoints (built once per session per
architecture) and a runner factory. See ``tiny_models.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import tiny_models / engine_fakes directly

from tiny_models import make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """``tiny_checkpoint(arch) -> Path``: a tiny random checkpoint, built once per session."""
    root = tmp_path_factory.mktemp("tiny_models")
    built: dict[str, Path] = {}

    def build(arch: str) -> Path:
        if arch not in built:
            built[arch] = make_tiny_checkpoint(arch, root)
        return built[arch]

    return build


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint("llama")


@pytest.fixture
def make_runner():
    """``make_runner(model_dir, **engine_config_overrides) -> ModelRunner`` (CPU, fp32)."""
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    def build(model_dir, **overrides):
        model = None if model_dir is None else str(model_dir)
        values = dict(model=model, device="cpu", block_size=4, kv_cache_tokens=256)
        values.update(overrides)
        return ModelRunner(EngineConfig(**values))

    return build


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch) -> Path:
    """Point ``TOKENOPS_CACHE`` at a fresh folder (the random default model goes there)."""
    monkeypatch.setenv("TOKENOPS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def two_byte_activations():
    """The kernels with two-byte activations (``q d + q2 d2``) for this test, whatever the engines built
    before it set: for tests whose reference is the two-byte rounding (``quant_blocks.quantize_activations``)
    or whose tolerance is the float32 path's. The default is one byte (tests/engine/test_quant_act_bytes.py
    checks every path against the one-byte reference)."""
    from dataclasses import replace

    from tokenops.engine.kernels import switches

    saved = switches.current
    switches.apply(replace(saved, quant_act_bytes=2))
    try:
        yield
    finally:
        switches.apply(saved)
