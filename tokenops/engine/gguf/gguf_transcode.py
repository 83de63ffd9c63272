"""GGUF encodings the kernels do not multiply from, read by transcoding them to Q8_0 at load.

llama.cpp's quantizer mixes types inside one file: a Q4_K_M file carries Q5_0 (and Q8_0, Q6_K)
tensors for the layers that need more bits, and recent releases ship IQ4_NL / IQ4_XS, Q3_K and
Q2_K files. Those blocks are decoded here (vectorised torch, ggml's bit layouts from
``ggml-common.h``; the tests check them against ``gguf.quants.dequantize``) and re-encoded once,
at load, as Q8_0 (32 weights, one float16 scale, int8 codes): the tensor stays quantized and every
product of it runs on the Q8_0 kernels of each CPU (AVX2, AVX-512, AMX).

What it costs: Q8_0 holds 8.5 bits a weight, so a transcoded tensor takes 1.5x (Q5_0, 5.5 bits)
to 3.3x (Q2_K, 2.6 bits) its bytes in the file; its error is the source's plus Q8_0's rounding,
a step of ``max|w| / 127`` per 32 weights, well under the source's own steps of ``max|w| / 15``
(4-bit) or ``/ 31`` (5-bit). A tensor read as Q8_0 is named in the weight format of the engine's
stats with its source type (``Q5_0>Q8_0``).
"""

from __future__ import annotations

import torch

QK_K = 256
Q8_0 = 8  # ggml type ids
Q8_0_BYTES = 34

#: the 16 non-linear levels of IQ4_NL and IQ4_XS (ggml's ``kvalues_iq4nl``)
IQ4_LEVELS = torch.tensor(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=torch.float32
)


def _f16(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float16).squeeze(-1).float()


def _u32(raw: torch.Tensor) -> torch.Tensor:
    """Little-endian uint32 of the last axis (4 bytes), as int64 ``[n]``."""
    r = raw.to(torch.int64)
    return r[:, 0] | (r[:, 1] << 8) | (r[:, 2] << 16) | (r[:, 3] << 24)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """``[n, 32]`` 0/16: the fifth bit of each of a 32-block's values (bit j of ``qh`` for value j)."""
    bits = (_u32(qh)[:, None] >> torch.arange(32, dtype=torch.int64)[None, :]) & 1
    return (bits << 4).to(torch.float32)


def _low_high(qs: torch.Tensor) -> torch.Tensor:
    """``[n, 32]``: the low nibbles of 16 bytes (values 0-15), then the high ones (16-31)."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=1).to(torch.float32)


def q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, 0:2])
    q = _low_high(b[:, 6:22]) + _fifth_bits(b[:, 2:6]) - 16.0
    return q * d[:, None]


def q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _low_high(b[:, 8:24]) + _fifth_bits(b[:, 4:8])
    return q * d[:, None] + m[:, None]


def iq4_nl(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, 0:2])
    idx = torch.cat((b[:, 2:18] & 0x0F, b[:, 2:18] >> 4), dim=1).long()
    return IQ4_LEVELS[idx] * d[:, None]


def iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    scales_h = b[:, 2].to(torch.int64) | (b[:, 3].to(torch.int64) << 8)
    sub = torch.arange(8, dtype=torch.int64)
    low = (b[:, 4:8].to(torch.int64)[:, sub // 2] >> (4 * (sub % 2))) & 0x0F
    high = (scales_h[:, None] >> (2 * sub)) & 3
    dl = d[:, None] * ((low | (high << 4)) - 32).to(torch.float32)  # [n, 8]
    qs = b[:, 8:136].reshape(n, 8, 16)
    idx = torch.cat((qs & 0x0F, qs >> 4), dim=2).long()  # [n, 8, 32]
    return (IQ4_LEVELS[idx] * dl[..., None]).reshape(n, QK_K)


def _two_bit_planes(qs: torch.Tensor) -> torch.Tensor:
    """``[n, 16, 16]``: the 2-bit codes of a K-quant super-block's 16 sub-blocks of 16, in ggml's
    order (two halves of 128; in each, four shifts over bytes 0-15 then 16-31 of its 32 bytes)."""
    n = qs.shape[0]
    q = qs.reshape(n, 2, 1, 2, 16).to(torch.int64)  # half, shift, byte group, byte
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int64)[None, None, :, None, None]
    return ((q >> shifts) & 3).reshape(n, 16, 16)


def q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc = b[:, 0:16].to(torch.float32)
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    q = _two_bit_planes(b[:, 16:80]).to(torch.float32)
    scale = d[:, None] * (sc.to(torch.int64) & 0x0F).to(torch.float32)
    low = dmin[:, None] * (sc.to(torch.int64) >> 4).to(torch.float32)
    return (q * scale[..., None] - low[..., None]).reshape(n, QK_K)


def _q3_k_scales(raw: torch.Tensor) -> torch.Tensor:
    """The 16 signed 6-bit scales of a Q3_K super-block (12 bytes), minus 32."""
    r = raw.to(torch.int64)
    low = torch.cat((r[:, 0:8] & 0x0F, r[:, 0:8] >> 4), dim=1)  # scales 0-7: low nibbles, 8-15: high
    high = (r[:, 8:12][:, torch.arange(16) % 4] >> (2 * (torch.arange(16) // 4))) & 3
    return (low | (high << 4)).to(torch.float32) - 32.0


def q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask = b[:, 0:32].to(torch.int64)
    d = _f16(b[:, 108:110])
    q = _two_bit_planes(b[:, 32:96])  # [n, 16, 16]
    # the third bit: bit (sub-block pair index) of hmask byte l (l over 0-31, halves then shifts)
    bit = torch.arange(8, dtype=torch.int64)
    hm = (hmask.reshape(n, 1, 2, 16) >> bit[None, :, None, None]) & 1  # [n, 8 (half*4+shift), 2, 16]
    q = q - 4 * (1 - hm.reshape(n, 16, 16))
    return (q.to(torch.float32) * (d[:, None] * _q3_k_scales(b[:, 96:108]))[..., None]).reshape(n, QK_K)


def requantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """float32 ``[rows, cols]`` (cols a multiple of 32) as Q8_0 blocks, uint8 ``[rows, cols / 32 * 34]``:
    per 32 weights ``d = max|w| / 127`` (float16) and ``round(w / d)``, as ggml's reference quantizer."""
    rows, cols = x.shape
    xb = x.reshape(rows, cols // 32, 32)
    d = (xb.abs().amax(-1) / 127.0).to(torch.float16)
    inv = torch.where(d.float() > 0, 1.0 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = torch.round(xb * inv[..., None]).clamp_(-127, 127).to(torch.int8)
    out = torch.empty(rows, cols // 32, Q8_0_BYTES, dtype=torch.uint8)
    out[..., 0:2] = d.contiguous().view(torch.uint8).reshape(rows, cols // 32, 2)
    out[..., 2:] = q.view(torch.uint8)
    return out.reshape(rows, cols // 32 * Q8_0_BYTES)


def transcode_rows(raw: torch.Tensor, dequantize_rows, out: torch.Tensor, chunk_rows: int = 256) -> None:
    """Rows of ``raw`` (their source blocks) decoded by ``dequantize_rows`` and written to ``out``
    as Q8_0, ``chunk_rows`` at a time (the float32 copy of a whole tensor is never held)."""
    for at in range(0, raw.shape[0], chunk_rows):
        out[at : at + chunk_rows].copy_(requantize_q8_0(dequantize_rows(raw[at : at + chunk_rows])))
