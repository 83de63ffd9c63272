"""The quantized linear kernels (``tokenops/engine/kernels/quant_kernels.py``) against ``gguf``'s own decoder
and torch's matmul: every format, 1-64 rows and ragged output counts, one and two threads, every path
(integer GEMV with and without VNNI, float32 GEMM, weights packed or in GGUF's layout), in the SIMD
build and in the plain-C fallback build."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from quant_blocks import K_QUANTS, quantize_activations, random_raw
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.kernels import quant_kernels, switches
from tokenops.engine.kernels.quant_kernels import Method, QuantKernels

#: the references here are the two-byte rounding (one byte: tests/engine/test_quant_act_bytes.py)
pytestmark = pytest.mark.usefixtures("two_byte_activations")

QTYPES = [QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_K, QT.Q6_K]
ROWS = [1, 3, 7, 16, 64]
OUT_FEATURES = 43  # not a multiple of 8 (a packed group) nor of 3 / 24 (the GEMM's tile and panel)
IN_FEATURES = 512  # two K-quant super-blocks, sixteen 32-blocks


def _kernels(plain: bool) -> QuantKernels:
    kernels = quant_kernels.get_kernels(plain=plain)
    if kernels is None:
        pytest.skip("no C compiler: the kernels cannot be built")
    return kernels


@pytest.fixture(params=[False, True], ids=["simd", "plain"])
def kernels(request: pytest.FixtureRequest) -> QuantKernels:
    return _kernels(request.param)


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf(kernels: QuantKernels, qtype: QT) -> None:
    raw = random_raw(qtype, OUT_FEATURES, IN_FEATURES, seed=1)
    ref = quant_kernels.dequantize_reference(raw, qtype, IN_FEATURES)
    assert torch.equal(kernels.dequantize(raw, qtype, IN_FEATURES), ref)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_linear_matches_reference(kernels: QuantKernels, qtype: QT, threads: int) -> None:
    """EXACT is float32-exact up to summation order; every other path equals the product with the
    activations rounded to two bytes per value (so any wrong code, scale or offset shows, and the path
    a row count picks does not change a row's result), within that rounding of the float32 product."""
    raw = random_raw(qtype, OUT_FEATURES, IN_FEATURES, seed=2)
    w = quant_kernels.dequantize_reference(raw, qtype, IN_FEATURES).double()
    packed = kernels.pack(raw, qtype, IN_FEATURES)
    assert packed is not None
    worst = 0.0
    for num_rows in ROWS:
        x = torch.randn(num_rows, IN_FEATURES, generator=torch.Generator().manual_seed(num_rows))
        exact = x.double() @ w.T
        rounded = quantize_activations(x).double() @ w.T
        for method in Method:
            for pw in [None, packed] if packed is not None else [None]:
                y = kernels.linear(x, None if pw else raw, qtype, IN_FEATURES, method, threads, pw)
                assert y.shape == (num_rows, OUT_FEATURES) and y.dtype == torch.float32
                if method == Method.EXACT:
                    assert _rel_err(y, exact) < 1e-5, (num_rows, pw is not None)
                else:
                    assert _rel_err(y, rounded) < 1e-5, (num_rows, method, pw is not None)
                    worst = max(worst, _rel_err(y, exact))
    assert worst < 1e-4
    print(f"{qtype.name}: max relative error of the two-byte-activation paths vs float32: {worst:.2e}")


def test_exact_switch_changes_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = _kernels(False)
    raw = random_raw(QT.Q4_K, 16, 256)
    x = torch.randn(2, 256)
    exact = x.double() @ quant_kernels.dequantize_reference(raw, QT.Q4_K, 256).double().T
    assert _rel_err(kernels.linear(x, raw, QT.Q4_K, 256), exact) > 1e-7
    monkeypatch.setattr(switches, "current", replace(switches.current, quant_exact=True))
    assert _rel_err(kernels.linear(x, raw, QT.Q4_K, 256), exact) < 1e-5


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_packed_rows_decode_like_the_raw_ones(kernels: QuantKernels, qtype: QT) -> None:
    width = 512 if qtype in K_QUANTS else 64
    raw = random_raw(qtype, OUT_FEATURES, width, seed=3)
    packed = kernels.pack(raw, qtype, width)
    extra = 4 * width // 256 if qtype in (QT.Q4_K, QT.Q5_K) else 0  # their scales and mins a byte each
    assert packed is not None and packed.data.numel() == (OUT_FEATURES + 7) // 8 * 8 * (raw.shape[1] + extra)
    ref = quant_kernels.dequantize_reference(raw, qtype, width)
    assert torch.equal(kernels.unpack_rows(packed), ref)
    arena = torch.zeros(kernels.packed_bytes(qtype, OUT_FEATURES, width) + 5, dtype=torch.uint8)
    into = kernels.pack(raw, qtype, width, out=arena[5:])
    assert into is not None and into.data.data_ptr() == arena[5:].data_ptr() and torch.equal(into.data, packed.data)
    ids = torch.tensor([[42, 0], [7, 8]])
    assert torch.equal(kernels.unpack_rows(packed, ids), ref[ids])
    with pytest.raises(IndexError):
        kernels.unpack_rows(packed, torch.tensor([OUT_FEATURES]))


def test_simd_build_uses_the_cpu(kernels: QuantKernels) -> None:
    flags = open("/proc/cpuinfo").read() if not kernels.plain else ""
    assert kernels.has_avx2 == (" avx2" in flags and " fma" in flags and " f16c" in flags)
    assert kernels.has_avx512 == (" avx512_vnni" in flags and " avx512bw" in flags)  # the run-time check
    if kernels.plain:
        assert not kernels.has_vnni


def test_leading_dims_and_empty_batches() -> None:
    kernels = _kernels(False)
    raw = random_raw(QT.Q4_1, 16, 64)
    x = torch.randn(2, 3, 64)
    y = kernels.linear(x, raw, QT.Q4_1, 64)
    assert y.shape == (2, 3, 16)
    assert torch.allclose(y.reshape(6, 16), kernels.linear(x.reshape(6, 64), raw, QT.Q4_1, 64))
    assert kernels.linear(torch.empty(0, 64), raw, QT.Q4_1, 64).shape == (0, 16)


def test_bad_inputs_say_what_is_wrong() -> None:
    kernels = _kernels(False)
    raw = random_raw(QT.Q4_0, 8, 64)
    with pytest.raises(ValueError, match="multiple of the 256-value block"):
        kernels.row_bytes(QT.Q4_K, 576)
    with pytest.raises(ValueError, match="no kernel"):
        kernels.row_bytes(QT.Q5_0, 64)
    with pytest.raises(ValueError, match=r"raw must be uint8 \[out_features, 36\]"):
        kernels.linear(torch.randn(1, 64), raw[:, :30], QT.Q4_0, 64)
    with pytest.raises(ValueError, match="x must be float32"):
        kernels.linear(torch.randn(1, 64, dtype=torch.float64), raw, QT.Q4_0, 64)


def test_module_linear_falls_back_without_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = random_raw(QT.Q8_0, 24, 96)
    x = torch.randn(2, 96)
    fast = quant_kernels.linear(x, raw, QT.Q8_0, 96)
    monkeypatch.setattr(quant_kernels, "get_kernels", lambda plain=False: None)
    assert quant_kernels.pack(raw, QT.Q8_0, 96) is None
    slow = quant_kernels.linear(x, raw, QT.Q8_0, 96)
    assert _rel_err(fast, slow.double()) < 1e-4
    assert torch.allclose(slow, x @ quant_kernels.dequantize_reference(raw, QT.Q8_0, 96).T)


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_avx512_and_avx2_packed_paths_agree(qtype: QT) -> None:
    """The 512-bit kernels (two groups of eight rows per instruction) give the 256-bit VNNI kernels'
    floats exactly: one group, one pair, pairs and an odd last group, 1-70 rows, two threads."""
    kernels = _kernels(False)
    if not kernels.has_avx512:
        pytest.skip("this CPU (or build) has no AVX-512 VNNI")
    width = 512 if qtype in K_QUANTS else 256
    for out_features in (8, 16, 43, 64):
        raw = random_raw(qtype, out_features, width, seed=out_features)
        packed = kernels.pack(raw, qtype, width)
        w = quant_kernels.dequantize_reference(raw, qtype, width).double()
        for num_rows in (1, 3, 4, 70):
            x = torch.randn(num_rows, width, generator=torch.Generator().manual_seed(num_rows))
            try:
                assert kernels.set_avx512(True)
                wide = kernels.linear(x, None, qtype, width, Method.GEMV, 2, packed)
                assert not kernels.set_avx512(False)
                narrow = kernels.linear(x, None, qtype, width, Method.GEMV, 2, packed)
            finally:
                kernels.set_avx512(None)
            assert torch.equal(wide, narrow), (out_features, num_rows)
            assert _rel_err(wide, quantize_activations(x).double() @ w.T) < 1e-5


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1], ids=lambda t: t.name)
def test_amx_tiles_give_the_512_bit_kernels_floats(qtype: QT) -> None:
    """AMX tiles (three or more rows) give the 512-bit kernel's floats exactly, so a verify or batched row
    equals the row decoded alone: one group, pairs in passes of one, two and three, an odd last group,
    rows across the tile passes (8) and the row blocks (64), two threads."""
    kernels = _kernels(False)
    if not kernels.has_amx:
        pytest.skip("this CPU (or build, or OS) has no AMX-INT8")
    width = 256
    for out_features in (8, 16, 43, 64, 100):
        raw = random_raw(qtype, out_features, width, seed=out_features)
        packed = kernels.pack(raw, qtype, width)
        for num_rows in (2, 3, 4, 5, 6, 7, 8, 9, 17, 70):
            x = torch.randn(num_rows, width, generator=torch.Generator().manual_seed(num_rows))
            try:
                assert kernels.set_amx(True)
                tiles = kernels.linear(x, None, qtype, width, Method.GEMV, 2, packed)
                assert not kernels.set_amx(False)
                vectors = kernels.linear(x, None, qtype, width, Method.GEMV, 2, packed)
            finally:
                kernels.set_amx(None)
            assert torch.equal(tiles, vectors), (out_features, num_rows)
            alone = kernels.linear(x[-1:], None, qtype, width, Method.GEMV, 2, packed)
            assert torch.equal(tiles[-1:], alone), (out_features, num_rows)


@pytest.mark.parametrize(
    ("field", "active", "available"),
    [("quant_avx512", "avx512_active", "has_avx512"), ("quant_amx", "amx_active", "has_amx")],
    ids=["avx512", "amx"],
)
def test_config_switch_keeps_the_narrower_path(field: str, active: str, available: str) -> None:
    """``quant_avx512 = False`` keeps the 256-bit kernels, ``quant_amx = False`` the vector ones: the
    engine's switches reach every loaded library."""
    kernels = _kernels(False)
    try:
        for on, expect in ((False, False), (True, getattr(kernels, available))):
            switches.apply(replace(switches.current, **{field: on}))
            assert getattr(kernels, active) is expect, on
    finally:
        switches.apply(switches.KernelSwitches())
    assert getattr(kernels, active) is getattr(kernels, available)


def test_the_environment_is_a_default_read_at_config_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TOKENOPS_QUANT_AVX512=0`` (and the other variables) still work: as the defaults of the
    ``EngineConfig`` fields, read when a config is made, never by the kernels."""
    for variable, value in (
        ("TOKENOPS_QUANT_AVX512", "0"),
        ("TOKENOPS_QUANT_AMX", "0"),
        ("TOKENOPS_QUANT_EXACT", "1"),
        ("TOKENOPS_NATIVE_ATTENTION", "0"),
        ("TOKENOPS_QUANT_AMX_MIN_ROWS", "6"),
    ):
        monkeypatch.setenv(variable, value)
    config = EngineConfig()
    assert (config.quant_avx512, config.quant_amx, config.quant_exact, config.native_kernels) == (False,) * 2 + (
        True,
        False,
    )
    assert config.quant_amx_min_rows == 6
    monkeypatch.setenv("TOKENOPS_QUANT_AVX512", "1")
    assert config.quant_avx512 is False and EngineConfig().quant_avx512 is True  # read at load, not later
    monkeypatch.setenv("TOKENOPS_QUANT_AMX_MIN_ROWS", "zero")
    assert EngineConfig().quant_amx_min_rows == 0  # not a positive integer: the build's default
    with pytest.raises(ValueError, match="quant_exact must be true or false"):
        EngineConfig(quant_exact="yes")


def test_amx_min_rows_is_a_switch() -> None:
    """The tiles start at 3 rows (measured on the default model's whole step); ``quant_amx_min_rows``
    moves that for another CPU, and 0 keeps 3."""
    kernels = _kernels(False)
    assert kernels.amx_min_rows == 3
    try:
        switches.apply(replace(switches.current, quant_amx_min_rows=6))
        assert kernels.amx_min_rows == 6
    finally:
        switches.apply(switches.KernelSwitches())
    assert kernels.amx_min_rows == 3
