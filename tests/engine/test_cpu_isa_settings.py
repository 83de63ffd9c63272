"""The ``cpu_isa`` switch as a setting (tokenops/engine/kernels/switches.py, EngineConfig): its
default from ``TOKENOPS_CPU``, a bad value refused naming the setting, PyTorch held to AVX2 by the
variables it reads, and the kernel choice on ``serve``'s "loaded" line (tokenops/cli/serve_progress.py,
tokenops/gateway/core/model_loading.py ``kernels_of``). In process; the libraries themselves are checked
in test_cpu_isa.py, the switch through a running ``serve`` in test_cpu_isa_serve.py."""

from __future__ import annotations

import io

import pytest
from tokenops.cli.serve_progress import StartProgress
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.kernels import switches
from tokenops.gateway.core.model_loading import kernels_of


def test_cpu_isa_defaults_to_native_and_reads_tokenops_cpu(monkeypatch) -> None:
    monkeypatch.delenv("TOKENOPS_CPU", raising=False)
    assert EngineConfig().cpu_isa == "native"
    monkeypatch.setenv("TOKENOPS_CPU", " AVX2 ")
    config = EngineConfig()
    assert config.cpu_isa == "avx2" and switches.KernelSwitches.of(config).cpu_isa == "avx2"
    assert EngineConfig(cpu_isa="native").cpu_isa == "native"  # a setting wins over the environment


def test_a_bad_cpu_isa_is_refused_naming_the_setting(monkeypatch) -> None:
    with pytest.raises(ValueError, match="cpu_isa .*'native', 'avx2'.*not 'avx512'"):
        EngineConfig(cpu_isa="avx512")
    monkeypatch.setenv("TOKENOPS_CPU", "sse2")
    with pytest.raises(ValueError, match="TOKENOPS_CPU"):
        EngineConfig()


def test_torch_is_held_to_avx2_only_when_asked() -> None:
    env = {"TOKENOPS_CPU": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2_VNNI"}
    assert switches.limit_torch_isa(env) == {"ATEN_CPU_CAPABILITY": "avx2"}
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2_VNNI"  # what the user set stays
    native = {"TOKENOPS_CPU": "native"}
    assert switches.limit_torch_isa(native) == {} and native == {"TOKENOPS_CPU": "native"}
    assert switches.limit_torch_isa({}) == {}


class _Backend:
    def __init__(self, stats):
        self._stats = stats

    def stats(self):
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats


def test_the_loaded_line_names_the_kernels() -> None:
    assert kernels_of(_Backend({"cpu_isa": "avx2", "quant_kernels": "avx2"})) == "kernels avx2, cpu_isa avx2"
    assert kernels_of(_Backend({"cpu_isa": "native"})) == "cpu_isa native"  # float weights: no quantized products
    assert kernels_of(_Backend(None)) == kernels_of(_Backend(RuntimeError("x"))) == kernels_of(object()) == ""
    out = io.StringIO()
    progress = StartProgress(out, is_tty=False)
    try:
        progress.loaded("qwen", 2.25, "kernels avx512-vnni+amx, cpu_isa native")
        progress.loaded("upstream", 0.5)
    finally:
        progress.detach()
    assert out.getvalue().splitlines() == [
        "loaded qwen in 2.2 s (kernels avx512-vnni+amx, cpu_isa native)",
        "loaded upstream in 0.5 s",
    ]
