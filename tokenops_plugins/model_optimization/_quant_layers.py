"""Quantized linear layers and the in-place model rewrite used by the quantization
plugin (imported lazily so loading plugins does not import torch)."""

from __future__ import annotations

import torch
from torch import nn

MODES = ("none", "int8", "int4")


class Int8Linear(nn.Module):
    # buffers (register_buffer), declared for the type checker
    qweight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        self.register_buffer("qweight", torch.round(w / scale).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return self.qweight.to(dtype) * self.scale.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.dim() == 2
            and x.shape[0] <= MAX_KERNEL_ROWS
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and self.scale.dtype == torch.float32
        ):
            kernel = _q8_kernel()
            if kernel is not None:  # decode at batch 1-2: read the int8 weights, never dequantize them
                return kernel.linear_q8(x, self.qweight, self.scale, self.bias)
        return nn.functional.linear(x, self.dequantized(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


#: Rows up to which Int8Linear multiplies with the native int8 kernel (tokenops.engine.kernels.native): measured
#: on the 32M benchmark Llama's layers (2 threads), one row took 2.1 ms against 4.4 ms for float32
#: oneDNN and ~40 ms for dequantize-then-matmul; at 4 rows and more the unblocked kernel loses to
#: dequantizing.
MAX_KERNEL_ROWS = 2


def _q8_kernel():
    from tokenops.engine.kernels.native import get_kernel

    return get_kernel()


class Int4Linear(nn.Module):
    # buffers (register_buffer), declared for the type checker
    packed: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor

    def __init__(self, linear: nn.Linear, group_size: int = 128):
        super().__init__()
        out_f, in_f = linear.weight.shape
        group = group_size if in_f % group_size == 0 else in_f
        assert in_f % 2 == 0, "int4 packing needs an even number of input features"
        w = linear.weight.detach().float().view(out_f, in_f // group, group)
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15.0).clamp(min=1e-12)
        q = torch.round((w - lo) / scale).clamp(0, 15).to(torch.uint8).view(out_f, in_f)
        self.register_buffer("packed", q[:, 0::2] | (q[:, 1::2] << 4))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.register_buffer("minimum", lo.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.group_size, self.in_features, self.out_features = group, in_f, out_f

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        q = torch.stack((self.packed & 0x0F, self.packed >> 4), dim=-1).view(self.out_features, -1, self.group_size)
        w = q.to(dtype) * self.scale.to(dtype) + self.minimum.to(dtype)
        return w.view(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.dequantized(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


def quantize_model(model: nn.Module, mode: str, group_size: int = 128, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace linear layers in place; returns how many were replaced."""
    if mode not in MODES:
        raise ValueError(f"quantization mode must be one of {MODES}, not {mode!r}")
    if mode == "none":
        return 0
    replaced = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            if not isinstance(child, nn.Linear) or any(full.endswith(s) for s in skip):
                continue
            setattr(parent, name, Int8Linear(child) if mode == "int8" else Int4Linear(child, group_size))
            replaced += 1
    return replaced


def weight_bytes(model: nn.Module) -> int:
    """Bytes held by parameters and buffers (what quantization shrinks)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
