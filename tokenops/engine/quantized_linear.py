"""Linear layers and embeddings over weights kept in their GGUF encoding.

:func:`quantized_linear` is the one place a step multiplies by a quantized weight: today it
dequantizes the weight (one layer at a time, the copy lives only for that product) and calls
``F.linear``. A native kernel that multiplies straight from the blocks (signature
``linear(x: float32 [n, in], raw: uint8 [out, row_bytes], qtype: int, in_features: int)``)
plugs in here through :func:`set_kernel` without touching the model code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tokenops.engine.gguf_quants import QuantType, dequantize, quant_type

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

    def __init__(self, raw: torch.Tensor, ggml_type: int, in_features: int, name: str = "") -> None:
        super().__init__()
        self.qtype: QuantType = quant_type(ggml_type, name)
        assert raw.dtype == torch.uint8 and raw.dim() == 2, (name, raw.dtype, raw.shape)
        if raw.shape[1] != self.qtype.row_bytes(in_features):
            raise ValueError(f"GGUF tensor {name!r}: {raw.shape[1]} bytes per row do not hold {in_features} "
                             f"{self.qtype.name} values")
        self.register_buffer("raw", raw, persistent=False)
        self.in_features = in_features
        self.out_features = raw.shape[0]

    @property
    def ggml_type(self) -> int:
        return self.qtype.ggml_type

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.raw, self.qtype, dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dequantized rows ``ids`` (any shape) as ``[*ids.shape, in_features]``."""
        flat = ids.reshape(-1)
        out = dequantize(self.raw.index_select(0, flat), self.qtype, dtype)
        return out.reshape(*ids.shape, self.in_features)

    def extra_repr(self) -> str:
        return f"{self.qtype.name}, out_features={self.out_features}, in_features={self.in_features}"


def quantized_linear(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    """``x @ W.T`` for a quantized ``W`` (no bias): the seam native kernels plug into."""
    if (_kernel is not None and weight.ggml_type in _kernel_types and x.dtype == torch.float32
            and x.device.type == "cpu"):
        flat = x.reshape(-1, weight.in_features)
        y = _kernel(flat.contiguous(), weight.raw, weight.ggml_type, weight.in_features)
        return y.reshape(*x.shape[:-1], weight.out_features)
    return F.linear(x, weight.dequantize(x.dtype))


class QuantizedLinear(nn.Module):
    """A linear layer over one or more quantized weights stacked along the outputs (a fused
    ``qkv_proj`` whose q, k and v were stored in different encodings keeps three parts)."""

    def __init__(self, parts: list[QuantizedWeight], bias: torch.Tensor | None = None) -> None:
        super().__init__()
        assert parts and len({p.in_features for p in parts}) == 1
        self.parts = nn.ModuleList(parts)
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
