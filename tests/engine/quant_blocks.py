"""Encoded GGUF weights for the quantized kernel tests and benchmark: ``gguf.quants.quantize`` of
Gaussian weights where ``gguf`` can quantize the type, random valid blocks where it cannot."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

K_QUANTS = (QT.Q4_K, QT.Q5_K, QT.Q6_K)


def random_raw(qtype: QT, out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """uint8 ``[out_features, row_bytes]``. Random blocks have random codes and scales (every 6-bit
    scale/min of the K-quants, every int8 scale of Q6_K, bit patterns included) and small positive
    fp16 super-scales, so every code path of the decoders is hit."""
    rng = np.random.default_rng(seed)
    if qtype not in K_QUANTS:
        w = rng.standard_normal((out_features, in_features), dtype=np.float32) * 0.05
        return torch.from_numpy(quantize(w, qtype))
    n = out_features * (in_features // 256)

    def f16(lo: float, hi: float) -> np.ndarray:
        return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)

    def codes(k: int) -> np.ndarray:
        return rng.integers(0, 256, (n, k), dtype=np.uint8)

    parts = {QT.Q4_K: [f16(1e-3, 2e-2), f16(1e-3, 2e-2), codes(12 + 128)],
             QT.Q5_K: [f16(1e-3, 2e-2), f16(1e-3, 2e-2), codes(12 + 32 + 128)],
             QT.Q6_K: [codes(208), f16(5e-4, 5e-3)]}[qtype]
    return torch.from_numpy(np.concatenate(parts, axis=1).reshape(out_features, -1).copy())


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the integer GEMV sees it, back in float32: per block of 32, ``q d + q2 d2`` with
    ``d = max|x| / 127``, ``q = round(x / d)``, ``d2 = d / 254``, ``q2 = round((x - q d) / d2)``
    (round half to even, the C side's float32 operations in its order). The kernels' products equal
    ``quantize_activations(x) @ W.T`` up to float rounding."""
    num_rows, k = x.shape
    xb = x.reshape(num_rows, k // 32, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(xb * inv)
    d2 = d / 254.0
    inv2 = torch.where(d2 > 0, 1.0 / d2, torch.zeros_like(d2))
    q2 = torch.round((xb - q * d) * inv2).clamp(-127, 127)
    return (q * d + q2 * d2).reshape(num_rows, k)
