"""Weights packed in panels of 16 output features, the layout the fused decode step's products
stream (:mod:`tokenops.engine.kernels.fused_decode`, C source in ``tokenops/engine/csrc/fused_decode.c``):
``[N/16][K][16]`` in float32, or in bfloat16 with each panel row's features reordered for the C
side's widening. Also the huge-page arena they live in (the CPU KV cache is allocated the same
way), and :class:`PanelWeight`, which lets a PyTorch linear layer multiply through them."""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

import torch

#: Output features per weight panel (the C products' register tile is 16 wide)
PANEL = 16
#: The panels' storage types: float32, or bfloat16 (half the bytes each step streams; the weights
#: rounded to 8 mantissa bits, so the model's numbers change).
PANEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Where a bfloat16 panel row stores output feature j (see the C source: an in-lane unpack with
#: zeros then yields features 0-7 and 8-15 in order).
_BF16_ORDER = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


class PanelDtypeUnavailable(ValueError):
    """A bfloat16 ``panel_dtype`` was asked for a model the fused decode step does not run."""


def hugepage_arena(num: int, dtype: torch.dtype = torch.float32) -> tuple[mmap.mmap, torch.Tensor]:
    """A tensor of ``num`` elements of ``dtype`` in anonymous memory (zeros, committed as it is
    touched), 2 MiB aligned and advised to use transparent huge pages (Linux; elsewhere plain
    pages): streaming ~100 MB of weights per token through 4 KiB pages costs a TLB miss every 4 KiB,
    and huge pages measured ~15% faster here. Returns the mapping too: keep it while the tensor lives."""
    align, size = 2 << 20, num * dtype.itemsize
    buf = mmap.mmap(-1, size + align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    offset = (-address) % align
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE, offset, size - size % mmap.PAGESIZE or mmap.PAGESIZE)
        except OSError:
            pass
    return buf, torch.frombuffer(buf, dtype=dtype, count=num, offset=offset)


def _panelled_size(w: torch.Tensor) -> int:
    """Floats of ``w`` ([N, K]) packed in panels of :data:`PANEL` rows (the last zero-padded)."""
    return -(-w.shape[0] // PANEL) * PANEL * w.shape[1]


def _pack_panels(w: torch.Tensor, out: torch.Tensor) -> None:
    """Write ``w`` ([N, K], row-major) into ``out`` as ``[N / PANEL][K][PANEL]``: the layout the C
    products stream (one step down K reads PANEL consecutive output features). A bfloat16 ``out``
    gets the weights rounded to nearest and each panel row's features in :data:`_BF16_ORDER`."""
    n, k = w.shape
    panels = -(-n // PANEL)
    view = out.view(panels, k, PANEL)
    order = _BF16_ORDER if out.dtype == torch.bfloat16 else slice(None)
    full = n // PANEL
    if full:
        view[:full].copy_(w[: full * PANEL].reshape(full, PANEL, k).transpose(1, 2)[..., order])
    if n % PANEL:
        tail = torch.zeros(PANEL, k, dtype=w.dtype)
        tail[: n % PANEL] = w[full * PANEL :]
        view[full].copy_(tail.t()[..., order])


def pack_arena(weights: list[torch.Tensor], dtype: torch.dtype) -> tuple[mmap.mmap, torch.Tensor, dict[int, int]]:
    """Every distinct tensor of ``weights`` packed in panels, one after the other, into a new huge-page
    arena of ``dtype``; returns the mapping, the arena and id(weight) -> address of its panels."""
    distinct = list({id(w): w for w in weights}.values())
    buf, arena = hugepage_arena(sum(_panelled_size(w) for w in distinct), dtype)
    copies: dict[int, int] = {}
    at = 0
    with torch.no_grad():
        for w in distinct:
            size = _panelled_size(w)
            _pack_panels(w.detach(), arena[at : at + size])
            copies[id(w)] = arena[at:].data_ptr()
            at += size
    return buf, arena, copies


class PanelWeight:
    """A linear layer's weight in the decoder's arena: ``(x, bias) -> x @ W.T + bias`` through the
    fused step's products (one native call; ``x`` float32 on CPU, any leading shape)."""

    __slots__ = ("decoder", "address", "out_features", "in_features")

    def __init__(self, decoder: Any, address: int, out_features: int, in_features: int) -> None:
        self.decoder = decoder  # keeps the arena alive
        self.address = address
        self.out_features = out_features
        self.in_features = in_features

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32 or not rows.is_contiguous():
            rows = rows.to(torch.float32).contiguous()
        y = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        if rows.shape[0]:
            self.decoder._linear_fn(
                rows.data_ptr(),
                rows.shape[0],
                self.address,
                None if bias is None else bias.data_ptr(),
                y.data_ptr(),
                self.out_features,
                self.in_features,
                torch.get_num_threads(),
            )
        return y.view(*lead, self.out_features)
