"""Building blocks shared by the model families: RMSNorm, the gated MLP and the paged
self-attention layer (rotary embeddings are in :mod:`tokenops.engine.models.rope`).

Projections that read the same input are fused (``qkv_proj``, ``gate_up_proj``) so a
layer makes fewer, larger matmuls; the loader splits Hugging Face weights into them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from tokenops.engine.kernels.attention import AttentionMetadata, paged_attention
from tokenops.engine.models.args import ModelArgs
from tokenops.engine.models.rope import apply_rope, rope_cos_sin

if TYPE_CHECKING:
    from tokenops.engine.kernels.panels import PanelWeight

__all__ = ["Embedding", "GatedMLP", "Linear", "RMSNorm", "SelfAttention", "activation", "apply_rope", "rope_cos_sin"]

_ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str):
    """The activation function called ``name`` in HF configs."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}; supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


class Linear(nn.Linear):
    """``nn.Linear`` without random initialisation: weights always come from a checkpoint,
    and initialising billions of parameters only to overwrite them costs seconds.

    After :meth:`pack` (see :mod:`tokenops.engine.kernels.weight_layout`) the layer multiplies
    through oneDNN with its weight prepacked in the GEMM's own blocked layout; with a
    :attr:`panel`, through the fused decode step's products over its packed copy."""

    #: The oneDNN-packed weight (an opaque ``mkldnn`` tensor), or None: plain ``F.linear``.
    packed: torch.Tensor | None = None
    #: The weight as the fused decode step packs it (a callable ``(x, bias) -> y``, see
    #: tokenops/engine/kernels/fused_decode.py), or None.
    panel: PanelWeight | None = None

    def reset_parameters(self) -> None:
        pass

    def pack(self, release: bool = True) -> None:
        """Reorder the weight for oneDNN once; ``release`` frees the dense copy (keep it
        when another module shares the tensor, e.g. tied embeddings)."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        if release:
            self.weight = nn.Parameter(self.weight.new_empty((0,)), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.panel is not None:
            return self.panel(x, self.bias)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Embedding):
    """``nn.Embedding`` without random initialisation (see :class:`Linear`)."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as the reference implementation does.

    With ``offset`` (Gemma's 1.0) the scale is ``offset + weight`` and is applied before
    the cast back, as Gemma's reference does."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0, **factory) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **factory))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset:
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * (self.offset + self.weight.float())).to(x.dtype)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # one dispatch instead of seven (on CPU still a composite inside: ~16 vs ~24 us per call at
            # 1 x 512); the same float32 arithmetic, bit-identical in the tests
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused in one matmul."""

    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False, **factory) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=bias, **factory)
        self.down_proj = Linear(intermediate, hidden, bias=bias, **factory)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class SelfAttention(nn.Module):
    """Multi-head attention with GQA, optional q/k RMSNorm (Qwen3, Gemma 3), a sliding
    window and Gemma 2's score soft-capping.

    ``k_cache``/``v_cache`` are views into the runner's preallocated cache, bound by
    :meth:`bind_cache`; the layer never allocates cache memory itself.
    """

    def __init__(self, args: ModelArgs, layer_idx: int, **factory) -> None:
        super().__init__()
        self.num_heads = args.num_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.scale = args.attn_scale
        self.softcap = args.attn_softcap
        self.window = args.layer_windows[layer_idx]
        #: which rotary table the layer uses (Gemma 3's sliding layers have their own base)
        self.rope_kind = "local" if args.uses_local_rope(layer_idx) else "global"
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = Linear(args.hidden_size, q_size + 2 * kv_size, bias=args.qkv_bias, **factory)
        self.o_proj = Linear(q_size, args.hidden_size, bias=args.o_bias, **factory)
        norm = args.rms_norm_eps, args.norm_offset
        self.q_norm = RMSNorm(self.head_dim, *norm, **factory) if args.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, *norm, **factory) if args.qk_norm else None
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None  # int8 cache only

    def bind_cache(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> None:
        assert k_cache.shape[2:] == (self.num_kv_heads, self.head_dim), k_cache.shape
        self.k_cache, self.v_cache = k_cache, v_cache
        self.kv_scales = kv_scales

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        assert self.k_cache is not None and self.v_cache is not None, "bind_cache() before forward()"
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        q_size, kv_size = self.split_sizes[0], self.split_sizes[1]
        v = qkv[:, q_size + kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            assert self.k_norm is not None  # qk_norm builds both
            q, k, _ = qkv.split(self.split_sizes, dim=-1)
            q = self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        else:  # q and k heads rotated together: one pass of the rotary ops instead of two
            qk = apply_rope(
                qkv[:, : q_size + kv_size].view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin
            )
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        out = paged_attention(
            q, k, v, self.k_cache, self.v_cache, meta, self.scale, self.window, self.kv_scales, self.softcap
        )
        return self.o_proj(out.reshape(num_tokens, -1))
