"""Linear layers and embeddings over weights kept in their GGUF encoding.

:func:`quantized_linear` is the one place a step multiplies by a quantized weight. On CPU with
float32 activations it runs the native kernels of :mod:`tokenops.engine.kernels.quant_kernels` straight
from the blocks (Q8_0, Q4_0, Q4_1 and the K-quants); :func:`pack_weights` repacks every one of
them at load into the kernels' interleaved row groups, in place of the file's layout (the bytes
are held once; embedding lookups decode rows from the packed groups). Elsewhere (another device or
dtype, a type without a kernel, no C compiler) it dequantizes the weight (one layer at a time, the
copy lives only for that product) and calls ``F.linear``. :func:`set_kernel` routes products to
another kernel (signature ``linear(x: float32 [n, in], raw: uint8 [out, row_bytes], qtype: int,
in_features: int)``) without touching the model code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, overload

import torch
import torch.nn.functional as F
from torch import nn

from tokenops.engine.gguf.gguf_quants import QuantType, dequantize, quant_type
from tokenops.engine.kernels import quant_kernels
from tokenops.engine.kernels.quant_kernels import PackedWeight

#: ``kernel(x, raw, qtype, in_features) -> y`` for the types it handles, or None (see :func:`set_kernel`).
Kernel = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]
_kernel: Kernel | None = None
_kernel_types: frozenset[int] = frozenset()


def set_kernel(kernel: Kernel | None, qtypes: frozenset[int] | set[int] = frozenset()) -> None:
    """Route float32 CPU products over ggml types ``qtypes`` to ``kernel`` (None: the torch path)."""
    global _kernel, _kernel_types
    _kernel, _kernel_types = kernel, frozenset(qtypes)


class QuantizedWeight(nn.Module):
    """A 2-D weight ``[out_features, in_features]`` held as GGUF blocks: ``raw`` is uint8
    ``[out_features, row_bytes]`` (a buffer, so ``.to(device)`` moves it and it is no parameter)."""

    raw: torch.Tensor  # the buffer, declared for the type checker

    def __init__(self, raw: torch.Tensor, ggml_type: int, in_features: int, name: str = "") -> None:
        super().__init__()
        self.qtype: QuantType = quant_type(ggml_type, name)
        assert raw.dtype == torch.uint8 and raw.dim() == 2, (name, raw.dtype, raw.shape)
        if raw.shape[1] != self.qtype.row_bytes(in_features):
            raise ValueError(
                f"GGUF tensor {name!r}: {raw.shape[1]} bytes per row do not hold {in_features} {self.qtype.name} values"
            )
        self.register_buffer("raw", raw, persistent=False)
        self.in_features = in_features
        self.out_features = raw.shape[0]
        #: set by :meth:`pack`: ``raw`` then holds the packed groups (``packed.data``), not the file's rows
        self.packed: PackedWeight | None = None
        self._arena: object = None  # the mapping a packed ``raw`` lives in

    @property
    def ggml_type(self) -> int:
        return self.qtype.ggml_type

    def packed_bytes(self) -> int:
        """Bytes :meth:`pack` needs (0: this weight stays in the file's layout)."""
        kernels = quant_kernels.get_kernels()
        if (
            self.packed is not None
            or kernels is None
            or self.raw.device.type != "cpu"
            or self.ggml_type not in quant_kernels.SUPPORTED
        ):
            return 0
        return kernels.packed_bytes(self.ggml_type, self.out_features, self.in_features)

    def pack(self, out: torch.Tensor | None = None, arena: object = None) -> bool:
        """Repack ``raw`` (into ``out``, :meth:`packed_bytes` bytes, when given; ``arena`` is kept
        alive with it) into the native kernels' row groups when they have a packed kernel for this
        type and the weight is on CPU (the file's layout is released). Returns whether it did."""
        if not self.packed_bytes():
            return self.packed is not None
        packed = _packed_kernels().pack(self.raw, self.ggml_type, self.in_features, out=out)
        assert packed is not None
        self.packed, self.raw, self._arena = packed, packed.data, arena
        return True

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.packed is not None:
            return _packed_kernels().unpack_rows(self.packed).to(dtype)
        return dequantize(self.raw, self.qtype, dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dequantized rows ``ids`` (any shape) as ``[*ids.shape, in_features]``."""
        if self.packed is not None:
            return _packed_kernels().unpack_rows(self.packed, ids.cpu()).to(dtype)
        flat = ids.reshape(-1)
        out = dequantize(self.raw.index_select(0, flat), self.qtype, dtype)
        return out.reshape(*ids.shape, self.in_features)

    def extra_repr(self) -> str:
        return f"{self.qtype.name}, out_features={self.out_features}, in_features={self.in_features}"


def _packed_kernels() -> quant_kernels.QuantKernels:
    kernels = quant_kernels.get_kernels()
    assert kernels is not None, "a packed weight outlived its kernels"
    return kernels


def pack_weights(model: nn.Module) -> int:
    """:meth:`QuantizedWeight.pack` every quantized weight of ``model`` (shared ones once) into one
    huge-page arena, in the order a step reads them; returns how many were packed."""
    from tokenops.engine.kernels.panels import hugepage_arena

    weights = list({id(m): m for m in model.modules() if isinstance(m, QuantizedWeight)}.values())
    sizes = [w.packed_bytes() for w in weights]
    if not any(sizes):
        return 0
    buf, arena = hugepage_arena(sum(sizes), torch.uint8)
    at = 0
    for weight, size in zip(weights, sizes):
        if size:
            weight.pack(arena[at : at + size], buf)
            at += size
    return sum(1 for s in sizes if s)


def quantized_linear(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    """``x @ W.T`` for a quantized ``W`` (no bias): the seam native kernels plug into."""
    if x.dtype == torch.float32 and x.device.type == "cpu":
        if _kernel is not None and weight.ggml_type in _kernel_types and weight.packed is None:
            flat = x.reshape(-1, weight.in_features)
            y = _kernel(flat.contiguous(), weight.raw, weight.ggml_type, weight.in_features)
            return y.reshape(*x.shape[:-1], weight.out_features)
        kernels = quant_kernels.get_kernels()
        if kernels is not None and weight.ggml_type in quant_kernels.SUPPORTED:
            raw = None if weight.packed is not None else weight.raw
            return kernels.linear(x, raw, weight.ggml_type, weight.in_features, packed=weight.packed)
    return F.linear(x, weight.dequantize(x.dtype))


class QuantizedWeights(nn.ModuleList):
    """An ``nn.ModuleList`` of :class:`QuantizedWeight` that says so to the type checker."""

    if TYPE_CHECKING:

        def __iter__(self) -> Iterator[QuantizedWeight]: ...

        @overload
        def __getitem__(self, idx: slice) -> nn.ModuleList: ...

        @overload
        def __getitem__(self, idx: int) -> QuantizedWeight: ...

        def __getitem__(self, idx: int | slice) -> QuantizedWeight | nn.ModuleList: ...


class QuantizedLinear(nn.Module):
    """A linear layer over one or more quantized weights stacked along the outputs (a fused
    ``qkv_proj`` whose q, k and v were stored in different encodings keeps three parts)."""

    def __init__(self, parts: list[QuantizedWeight], bias: torch.Tensor | None = None) -> None:
        super().__init__()
        assert parts and len({p.in_features for p in parts}) == 1
        self.parts = QuantizedWeights(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.parts) == 1:
            y = quantized_linear(x, self.parts[0])
        else:
            y = torch.cat([quantized_linear(x, p) for p in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias

    @property
    def type_names(self) -> list[str]:
        return [p.qtype.name for p in self.parts]


class QuantizedEmbedding(nn.Module):
    """Token embeddings that dequantize only the rows a step looks up."""

    def __init__(self, weight: QuantizedWeight, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight_q = weight
        self.dtype = dtype
        self.num_embeddings = weight.out_features
        self.embedding_dim = weight.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight_q.rows(ids, self.dtype)
