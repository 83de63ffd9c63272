"""One-byte activations (``quant_act_bytes = 1``, :meth:`QuantKernels.set_act_bytes`): every integer path
(512-bit, 256-bit VNNI, AVX2 ``maddubs`` without VNNI; packed and GGUF-layout weights; the GEMM on the
rounded activations) multiplies ``q d`` (one int8 code per value, a scale per block of 32; without VNNI,
for a K-quant weight, a scale per 256 values: llama.cpp's q8_K) against the dequantized weight, the 512-
and 256-bit kernels give the same floats, and two bytes come back unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from quant_blocks import K_QUANTS, quantize_activations, random_raw
from tokenops.engine.kernels import quant_kernels
from tokenops.engine.kernels.quant_kernels import Method, QuantKernels

QTYPES = [QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_K, QT.Q6_K]
ROWS = [1, 2, 3, 4, 7, 16, 70]


def one_byte(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` rounded as the one-byte products see it: per ``block`` values (a last part of fewer its own),
    ``q d`` with ``d = max|x| / 127`` and ``q = round(x / d)`` (half to even)."""
    parts = []
    for start in range(0, x.shape[1], block):
        xb = x[:, start : start + block]
        d = xb.abs().amax(-1, keepdim=True) / 127.0
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        parts.append(torch.round(xb * inv) * d)
    return torch.cat(parts, 1)


def block_of(k: QuantKernels, qtype: QT) -> int:
    """Values per activation scale at one byte: 256 for a K-quant on a build without VNNI (``TK_ACT_K256``,
    llama.cpp's q8_K), else 32 (its q8_0)."""
    return 256 if qtype in K_QUANTS and not k.has_vnni else 32


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


@pytest.fixture
def kernels() -> Iterator[QuantKernels]:
    k = quant_kernels.get_kernels()
    if k is None or not k.has_avx2:
        pytest.skip("no SIMD build of the kernels here")
    assert k.set_act_bytes(1) == 1
    try:
        yield k
    finally:
        k.set_act_bytes(None)
        k.set_avx512(None)


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_one_byte_paths_match_the_reference(kernels: QuantKernels, qtype: QT) -> None:
    """Every path and row count equals ``one_byte(x) @ W.T`` to float32 rounding (a wrong code, scale,
    offset or a dropped second byte would show), and the 512-bit kernels give the 256-bit ones' floats."""
    width = 512 if qtype in K_QUANTS else 256
    for out_features in (8, 43):
        raw = random_raw(qtype, out_features, width, seed=out_features)
        packed = kernels.pack(raw, qtype, width)
        assert packed is not None
        w = quant_kernels.dequantize_reference(raw, qtype, width).double()
        for num_rows in ROWS:
            x = torch.randn(num_rows, width, generator=torch.Generator().manual_seed(num_rows))
            ref = one_byte(x, block_of(kernels, qtype)).double() @ w.T
            results = {}
            for wide in (True, False):
                kernels.set_avx512(wide)
                for method in (Method.GEMV, Method.GEMV_MADDUBS):
                    results[wide, method] = kernels.linear(x, None, qtype, width, method, 2, packed)
            for key, y in results.items():
                assert _rel_err(y, ref) < 1e-5, (out_features, num_rows, key)
            assert torch.equal(results[True, Method.GEMV], results[False, Method.GEMV])
            for method in (Method.GEMV, Method.GEMM):  # GGUF's layout: the row-wise GEMV, the GEMM
                assert _rel_err(kernels.linear(x, raw, qtype, width, method, 1), ref) < 1e-5, (num_rows, method)


def test_two_bytes_come_back_unchanged(kernels: QuantKernels) -> None:
    """Switching to one byte and back leaves the two-byte products' floats as they were; one byte is
    further from the float32 product than two, within llama.cpp's one-byte error."""
    raw = random_raw(QT.Q4_K, 64, 1536, seed=3)
    packed = kernels.pack(raw, QT.Q4_K, 1536)
    w = quant_kernels.dequantize_reference(raw, QT.Q4_K, 1536).double()
    x = torch.randn(5, 1536, generator=torch.Generator().manual_seed(5))
    y1 = kernels.linear(x, None, QT.Q4_K, 1536, Method.GEMV, 1, packed)
    assert kernels.set_act_bytes(2) == 2 and kernels.act_bytes == 2
    y2 = kernels.linear(x, None, QT.Q4_K, 1536, Method.GEMV, 1, packed)
    assert _rel_err(y2, quantize_activations(x).double() @ w.T) < 1e-5
    assert kernels.set_act_bytes(3) == 2, "another value only reads the setting"
    assert kernels.set_act_bytes(1) == 1
    assert torch.equal(kernels.linear(x, None, QT.Q4_K, 1536, Method.GEMV, 1, packed), y1)
    exact = x.double() @ w.T
    assert _rel_err(y2, exact) < _rel_err(y1, exact) < 2e-2


def test_the_engine_switch_reaches_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """``quant_act_bytes`` is an ``EngineConfig`` field (default 1, from ``TOKENOPS_QUANT_ACT_BYTES``), checked
    at config load, handed to every loaded library by :func:`switches.apply`."""
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.kernels import switches

    k = quant_kernels.get_kernels()
    if k is None:
        pytest.skip("no C compiler: the kernels cannot be built")
    monkeypatch.delenv("TOKENOPS_QUANT_ACT_BYTES", raising=False)
    assert EngineConfig().quant_act_bytes == 1 and switches.KernelSwitches().quant_act_bytes == 1
    monkeypatch.setenv("TOKENOPS_QUANT_ACT_BYTES", "2")
    config = EngineConfig()
    assert config.quant_act_bytes == 2
    with pytest.raises(ValueError, match="quant_act_bytes .* must be 1 or 2"):
        EngineConfig(quant_act_bytes=3)
    saved = switches.current
    try:
        switches.apply(switches.KernelSwitches.of(config))
        assert k.act_bytes == 2
    finally:
        switches.apply(saved)
    assert k.act_bytes == saved.quant_act_bytes


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_one_byte_on_the_avx2_build(qtype: QT) -> None:
    """The Haswell-class build (``cpu_isa = "avx2"``: ``maddubs``, no VNNI, no 512-bit kernels) with one
    byte: the one-byte reference (a scale per 256 values for the K-quants, per 32 for Q8_0), its GEMM (on
    the rounded activations) the same, and the native build's ``maddubs`` the same floats where both
    round alike (Q8_0, or a native build without VNNI)."""
    import shutil

    from tokenops.engine.kernels import native

    ours = quant_kernels.get_kernels()
    if ours is None or shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the kernels cannot be built")
    avx2 = QuantKernels(native.build_library(main="quant.c", stem="quant", isa="avx2"))
    assert avx2.isa == "avx2"
    raw = random_raw(qtype, 40, 512, seed=9)
    w = quant_kernels.dequantize_reference(raw, qtype, 512).double()
    packed = avx2.pack(raw, qtype, 512)
    assert packed is not None
    try:
        assert avx2.set_act_bytes(1) == 1 and ours.set_act_bytes(1) == 1
        for num_rows in (1, 5, 70):
            x = torch.randn(num_rows, 512, generator=torch.Generator().manual_seed(num_rows))
            got = avx2.linear(x, None, qtype, 512, Method.GEMV, 2, packed)
            ref = one_byte(x, block_of(avx2, qtype)).double() @ w.T
            assert _rel_err(got, ref) < 1e-5, num_rows
            assert _rel_err(avx2.linear(x, raw, qtype, 512, Method.GEMM, 1), ref) < 1e-5, num_rows
            if block_of(ours, qtype) == block_of(avx2, qtype):
                assert torch.equal(got, ours.linear(x, None, qtype, 512, Method.GEMV_MADDUBS, 2, packed)), num_rows
    finally:
        avx2.set_act_bytes(2)
        ours.set_act_bytes(None)


def _avx2_kernels() -> QuantKernels:
    import shutil

    from tokenops.engine.kernels import native

    if quant_kernels.get_kernels() is None or shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the kernels cannot be built")
    return QuantKernels(native.build_library(main="quant.c", stem="quant", isa="avx2"))


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_avx2_one_byte_k_quants_every_row_count(qtype: QT) -> None:
    """The AVX2 one-byte K-quant kernels (``csrc/quant_packed_km.c``: one-row kernels, passes of up to 8
    rows, a last pass of 1-7): every row count 1-70, three super-blocks, a last group of 3 rows, equal the
    one-byte reference (a scale per 256 values), one activation row's outputs do not depend on the rows
    beside it, the GEMM on the rounded activations agrees, and a native build without VNNI gives the
    same floats; two bytes still equal their reference."""
    avx2, ours = _avx2_kernels(), quant_kernels.get_kernels()
    assert ours is not None
    out_features, width = 19, 768
    raw = random_raw(qtype, out_features, width, seed=int(qtype))
    w = quant_kernels.dequantize_reference(raw, qtype, width).double()
    packed = avx2.pack(raw, qtype, width)
    assert packed is not None
    x_all = torch.randn(70, width, generator=torch.Generator().manual_seed(70))
    try:
        assert avx2.set_act_bytes(1) == 1 and ours.set_act_bytes(1) == 1
        alone = avx2.linear(x_all[:1], None, qtype, width, Method.GEMV, 1, packed)
        for num_rows in range(1, 71):
            x = x_all[:num_rows]
            got = avx2.linear(x, None, qtype, width, Method.GEMV, 1 + num_rows % 2, packed)
            ref = one_byte(x, 256).double() @ w.T
            assert _rel_err(got, ref) < 1e-5, num_rows
            assert torch.equal(got[:1], alone), num_rows
            if num_rows in (1, 7, 8, 9, 16, 70):
                assert _rel_err(avx2.linear(x, raw, qtype, width, Method.GEMM, 1), ref) < 1e-5, num_rows
                if not ours.has_vnni:
                    want = ours.linear(x, None, qtype, width, Method.GEMV_MADDUBS, 2, packed)
                    assert torch.equal(got, want), num_rows
        assert avx2.set_act_bytes(2) == 2  # two bytes: the older kernels, still right
        for num_rows in (1, 9, 70):
            got = avx2.linear(x_all[:num_rows], None, qtype, width, Method.GEMV, 2, packed)
            assert _rel_err(got, quantize_activations(x_all[:num_rows]).double() @ w.T) < 1e-5, num_rows
    finally:
        avx2.set_act_bytes(2)
        ours.set_act_bytes(None)


@pytest.mark.parametrize("scales", ["kept", "largest"])
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_avx2_one_byte_sums_at_the_int16_bound(qtype: QT, scales: str) -> None:
    """The AVX2 one-byte kernels add ``maddubs`` pairs in int16 (Q4_K: a sub-block's 8 chunks, Q6_K: 2):
    with every code at its largest (15, 63) and every activation at +-127, the sums reach 30480 / 32004
    of int16's 32767 and must not saturate; with every scale and min at its largest too (Q4_K's 63,
    Q6_K's -128) a super-block's int32 sums reach 30.7M / 262M: the outputs still equal the reference."""
    avx2 = _avx2_kernels()
    out_features, width = 16, 512
    raw = random_raw(qtype, out_features, width, seed=5).clone()
    nb, bb = width // 256, raw.shape[1] // (width // 256)
    blocks = raw.view(out_features, nb, bb)
    if qtype == QT.Q4_K:
        blocks[:, :, 4 if scales == "largest" else 16 :] = 0xFF  # every nibble 15 (and 6-bit scale, min 63)
    else:
        blocks[:, :, :192] = 0xFF  # ql and qh: every code 63
        if scales == "largest":
            blocks[:, :, 192:208] = 0x80  # every int8 scale -128
    w = quant_kernels.dequantize_reference(raw, qtype, width).double()
    packed = avx2.pack(raw, qtype, width)
    assert packed is not None
    signs = torch.ones(8, width)
    signs[1] = -1.0
    signs[2, ::2] = -1.0
    x = signs * torch.linspace(1.0, 2.0, 8)[:, None]  # one value per row: every q +-127
    try:
        assert avx2.set_act_bytes(1) == 1
        for num_rows in (1, 3, 8, 17):
            xr = x[torch.arange(num_rows) % 8]
            ref = one_byte(xr, 256).double() @ w.T
            got = avx2.linear(xr, None, qtype, width, Method.GEMV, 1, packed)
            assert _rel_err(got, ref) < 1e-5, num_rows
    finally:
        avx2.set_act_bytes(2)


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1], ids=lambda t: t.name)
def test_avx2_one_byte_keeps_a_scale_per_32_for_the_32_value_formats(qtype: QT) -> None:
    """The 32-value formats on the AVX2 build (no VNNI) with one byte keep a scale per 32 values (llama.cpp's
    q8_0 for them; q8_K is for the K-quants), K = 352 and 608 (not multiples of 256): every path (packed,
    GGUF's layout, the GEMM) equals that reference, which is not the one with a scale per 256."""
    avx2 = _avx2_kernels()
    try:
        assert avx2.set_act_bytes(1) == 1
        for width in (352, 608):
            raw = random_raw(qtype, 20, width, seed=width)
            w = quant_kernels.dequantize_reference(raw, qtype, width).double()
            packed = avx2.pack(raw, qtype, width)
            assert packed is not None
            for num_rows in (1, 4, 9):
                x = torch.randn(num_rows, width, generator=torch.Generator().manual_seed(num_rows))
                x[:, 256:] *= 0.01  # a part far smaller than the first: its scales show
                ref = one_byte(x, 32).double() @ w.T
                for method in (Method.GEMV, Method.GEMV_MADDUBS):
                    assert _rel_err(avx2.linear(x, None, qtype, width, method, 1, packed), ref) < 1e-5
                for method in (Method.GEMV, Method.GEMM):
                    assert _rel_err(avx2.linear(x, raw, qtype, width, method, 1), ref) < 1e-5, (width, method)
                assert _rel_err(one_byte(x, 256).double() @ w.T, ref) > 1e-4
    finally:
        avx2.set_act_bytes(2)
