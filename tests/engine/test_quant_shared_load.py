"""The shared-load K-quant kernels (``tokenops/engine/csrc/quant_avx512_k.c``, 512-bit, and their 256-bit
VNNI twins in ``quant_packed_kv.c``: Q4_K at every row count, Q6_K at one row, the batch-1 decode
product) against the dequantized reference, and equal to each other and to the ``maddubs`` kernels
(which assemble each code before its products), at model-sized and ragged shapes, one and two threads."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from quant_blocks import quantize_activations, random_raw
from tokenops.engine.kernels import quant_kernels
from tokenops.engine.kernels.quant_kernels import Method

#: the references here are the two-byte rounding (one byte: tests/engine/test_quant_act_bytes.py)
pytestmark = pytest.mark.usefixtures("two_byte_activations")

# (out, in): one pair of groups; ragged with an odd last group; Qwen2.5-1.5B's k/v and down shapes
SHAPES = [(16, 256), (40, 768), (256, 1536), (72, 2560)]


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_shared_load_kernels_match_the_reference(qtype: QT, shape: tuple[int, int]) -> None:
    kernels = quant_kernels.get_kernels(plain=False)
    if kernels is None:
        pytest.skip("no C compiler: the kernels cannot be built")
    if not kernels.has_vnni:
        pytest.skip("this CPU (or build) has no VNNI")
    out_features, in_features = shape
    raw = random_raw(qtype, out_features, in_features, seed=out_features + in_features)
    packed = kernels.pack(raw, qtype, in_features)
    w = quant_kernels.dequantize_reference(raw, qtype, in_features).double()
    for num_rows, threads in ((1, 1), (1, 2), (2, 2), (5, 1)):
        x = torch.randn(num_rows, in_features, generator=torch.Generator().manual_seed(num_rows + threads))
        try:
            wide = None
            if kernels.has_avx512:
                assert kernels.set_avx512(True)
                wide = kernels.linear(x, None, qtype, in_features, Method.GEMV, threads, packed)
            assert not kernels.set_avx512(False)
            narrow = kernels.linear(x, None, qtype, in_features, Method.GEMV, threads, packed)
            maddubs = kernels.linear(x, None, qtype, in_features, Method.GEMV_MADDUBS, threads, packed)
        finally:
            kernels.set_avx512(None)
        ref = quantize_activations(x).double() @ w.T
        assert float((narrow.double() - ref).abs().max() / ref.abs().max()) < 1e-5, (num_rows, threads)
        assert torch.equal(narrow, maddubs), (num_rows, threads)
        assert wide is None or torch.equal(wide, narrow), (num_rows, threads)
