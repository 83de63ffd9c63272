"""GGUF weight encodings, dequantized with vectorised torch operations.

A GGUF tensor row is a run of fixed-size blocks (ggml's ``block_q4_0``, ``block_q4_K``...):
scales stored as float16 next to packed integers. The engine keeps every row in that
encoding (a ``uint8`` tensor ``[rows, row_bytes]``) and expands only what a step needs: the
rows of an embedding lookup, or one layer's weight for the length of one product
(:mod:`tokenops.engine.kernels.quantized_linear`). That keeps the resident weights at the file's
size instead of 4-8x it.

The bit layouts are ggml's (``ggml-common.h``); :func:`dequantize` agrees bit for bit with
the ``gguf`` package's numpy reference (``gguf.quants.dequantize``), which the tests check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenops.engine.gguf import gguf_transcode

QK_K = 256


@dataclass(frozen=True, slots=True)
class QuantType:
    """One GGUF tensor type the engine keeps as is: ``block_size`` weights in ``type_size`` bytes."""

    name: str
    ggml_type: int  # GGMLQuantizationType value
    block_size: int
    type_size: int
    dequantize_blocks: Callable[[torch.Tensor], torch.Tensor]  # uint8 [n, type_size] -> float32 [n, block_size]

    def row_bytes(self, num_columns: int) -> int:
        if num_columns % self.block_size:
            raise ValueError(f"{self.name} rows hold multiples of {self.block_size} values, not {num_columns}")
        return num_columns // self.block_size * self.type_size


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """Little-endian float16 from the last axis (2 bytes) of ``raw``, as float32 ``[...]``."""
    return raw.contiguous().view(torch.float16).squeeze(-1).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """float32 ``[n, 32]``: low nibbles of every byte first, then the high ones (ggml's order
    within a 32-block). Written straight into one float tensor: the fewest passes over memory
    that torch's elementwise kernels allow (about 2x faster than ``cat`` + ``float``)."""
    out = torch.empty(qs.shape[0], 2 * qs.shape[1], dtype=torch.float32, device=qs.device)
    out[:, : qs.shape[1]] = qs & 0x0F
    out[:, qs.shape[1] :] = qs >> 4
    return out


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 2:18]).sub_(8.0).mul_(d[:, None])


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 4:20]).mul_(d[:, None]).add_(m[:, None])


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, 0:2])
    return b[:, 2:34].contiguous().view(torch.int8).float().mul_(d[:, None])


def _k_scales_mins(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins of a Q4_K/Q5_K super-block (``get_scale_min_k4``)."""
    sc = sc.to(torch.int32)
    low_s, low_m, high = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scales = torch.cat((low_s & 63, (high & 0x0F) | ((low_s >> 6) << 4)), dim=-1)
    mins = torch.cat((low_m & 63, (high >> 4) | ((low_m >> 6) << 4)), dim=-1)
    return scales.float(), mins.float()


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    scales, mins = _k_scales_mins(b[:, 4:16])
    qs = b[:, 16:144].reshape(n, 4, 32)
    q = torch.stack((qs & 0x0F, qs >> 4), dim=2).reshape(n, 8, 32).float()  # sub-block j of 32 values
    return (q * (d[:, None] * scales)[..., None] - (dmin[:, None] * mins)[..., None]).reshape(n, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    scales, mins = _k_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]  # [n, 32]: bit j of byte l is the fifth bit of value l of sub-block j
    qs = b[:, 48:176].reshape(n, 4, 32)
    low = torch.stack((qs & 0x0F, qs >> 4), dim=2).reshape(n, 8, 32)
    shifts = torch.arange(8, dtype=torch.uint8)
    high = ((qh[:, None, :] >> shifts[None, :, None]) & 1) << 4
    q = (low | high).float()
    return (q * (d[:, None] * scales)[..., None] - (dmin[:, None] * mins)[..., None]).reshape(n, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 64)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    sc = b[:, 192:208].contiguous().view(torch.int8).float().reshape(n, 2, 8)
    d = _f16(b[:, 208:210])
    low = torch.cat((ql & 0x0F, ql >> 4), dim=-1).reshape(n, 2, 4, 32)  # values l, l+32, l+64, l+96
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[None, None, :, None]
    high = ((qh >> shifts) & 3) << 4
    q = (low | high).to(torch.int16).float() - 32.0  # [n, 2, 4, 32]
    # scale index within the half: 16 values share one, so [4, 32] -> [8, 16]
    q = q.reshape(n, 2, 8, 16) * sc[..., None]
    return q.reshape(n, QK_K) * d[:, None]


def _f32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def _f16_block(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _bf16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.bfloat16).float()


#: ggml type id -> its encoding. Add a row (and a test against ``gguf.quants.dequantize``) for a new type.
QUANT_TYPES: dict[int, QuantType] = {
    t.ggml_type: t
    for t in (
        QuantType("F32", 0, 1, 4, _f32),
        QuantType("F16", 1, 1, 2, _f16_block),
        QuantType("Q4_0", 2, 32, 18, _q4_0),
        QuantType("Q4_1", 3, 32, 20, _q4_1),
        QuantType("Q8_0", 8, 32, 34, _q8_0),
        QuantType("Q4_K", 12, QK_K, 144, _q4_k),
        QuantType("Q5_K", 13, QK_K, 176, _q5_k),
        QuantType("Q6_K", 14, QK_K, 210, _q6_k),
        QuantType("BF16", 30, 1, 2, _bf16),
        # read by transcoding to Q8_0 at load (tokenops/engine/gguf/gguf_transcode.py)
        QuantType("Q5_0", 6, 32, 22, gguf_transcode.q5_0),
        QuantType("Q5_1", 7, 32, 24, gguf_transcode.q5_1),
        QuantType("Q2_K", 10, QK_K, 84, gguf_transcode.q2_k),
        QuantType("Q3_K", 11, QK_K, 110, gguf_transcode.q3_k),
        QuantType("IQ4_NL", 20, 32, 18, gguf_transcode.iq4_nl),
        QuantType("IQ4_XS", 23, QK_K, 136, gguf_transcode.iq4_xs),
    )
}
#: the types above that the engine keeps as Q8_0 (decoded and re-encoded once, at load)
TRANSCODED_TO_Q8_0: frozenset[int] = frozenset({6, 7, 10, 11, 20, 23})


class UnsupportedQuantType(ValueError):
    """A GGUF tensor is in an encoding the engine does not implement."""


def quant_type(ggml_type: int, tensor_name: str = "") -> QuantType:
    """The :class:`QuantType` for ggml type id ``ggml_type``.

    :raises UnsupportedQuantType: with a one-line message naming the tensor and type.
    """
    qt = QUANT_TYPES.get(int(ggml_type))
    if qt is None:
        try:
            from gguf import GGMLQuantizationType

            type_name = GGMLQuantizationType(int(ggml_type)).name
        except (ImportError, ValueError):
            type_name = f"type {int(ggml_type)}"
        where = f"tensor {tensor_name!r} is " if tensor_name else ""
        supported = ", ".join(t.name for t in QUANT_TYPES.values())
        raise UnsupportedQuantType(f"GGUF {where}{type_name}, which tokenops cannot run; supported: {supported}")
    return qt


def dequantize(raw: torch.Tensor, qtype: QuantType, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows of ``raw`` (uint8 ``[rows, row_bytes]``) as ``dtype`` ``[rows, columns]``."""
    assert raw.dtype == torch.uint8 and raw.dim() == 2, (raw.dtype, raw.shape)
    rows, row_bytes = raw.shape
    assert row_bytes % qtype.type_size == 0, (qtype.name, row_bytes)
    blocks = raw.reshape(-1, qtype.type_size)
    out = qtype.dequantize_blocks(blocks).reshape(rows, row_bytes // qtype.type_size * qtype.block_size)
    return out if out.dtype == dtype else out.to(dtype)
