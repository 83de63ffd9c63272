"""Sparse mixture-of-experts feed-forward block (Mixtral, Qwen2-MoE, Qwen3-MoE).

Routing: softmax over the router logits, top-k, optional renormalisation of the k
weights (always for Mixtral, ``norm_topk_prob`` for Qwen). Qwen2-MoE adds a shared
expert whose output is scaled by ``sigmoid(shared_expert_gate(x))``.

Expert weights are stacked (``w_gate_up [E, 2I, H]``, ``w_down [E, H, I]``); tokens are
sorted by expert so each expert runs one matmul over all its tokens. The per-expert
counts that drive that loop are also accumulated into :attr:`expert_counts`, the
routed-token counter the engine reports as expert load. A GGUF file's experts stay in the
file's encoding instead: :meth:`SparseMoeBlock.set_experts` swaps the stacked parameters for
one pair of layers per expert (:class:`ExpertLayers`, quantized linears).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenops.engine.models.args import ModelArgs
from tokenops.engine.models.layers import GatedMLP, Linear, activation


class ExpertLayers(nn.Module):
    """Each expert's fused gate|up product (``gate_up[e]``, ``[2I] <- [H]``) and down product
    (``down[e]``, ``[H] <- [I]``) as layers of their own, in place of the stacked parameters."""

    def __init__(self, gate_up: list[nn.Module], down: list[nn.Module]) -> None:
        super().__init__()
        assert gate_up and len(gate_up) == len(down)
        self.gate_up = nn.ModuleList(gate_up)
        self.down = nn.ModuleList(down)


class SparseMoeBlock(nn.Module):
    """Top-k routed experts, plus the optional gated shared expert."""

    expert_counts: torch.Tensor  # a buffer (register_buffer), declared for the type checker

    def __init__(self, args: ModelArgs, **factory) -> None:
        super().__init__()
        self.num_experts = args.num_experts
        self.top_k = args.num_experts_per_tok
        self.norm_topk_prob = args.norm_topk_prob
        hidden, inter = args.hidden_size, args.moe_intermediate_size
        self.gate = Linear(hidden, self.num_experts, bias=False, **factory)
        self.w_gate_up = nn.Parameter(torch.empty(self.num_experts, 2 * inter, hidden, **factory))
        self.w_down = nn.Parameter(torch.empty(self.num_experts, hidden, inter, **factory))
        self.act = activation(args.hidden_act)
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: Linear | None = None
        if args.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(hidden, args.shared_expert_intermediate_size, args.hidden_act, **factory)
            self.shared_expert_gate = Linear(hidden, 1, bias=False, **factory)
        counts = torch.zeros(self.num_experts, dtype=torch.long, device=factory.get("device"))
        self.register_buffer("expert_counts", counts, persistent=False)
        self.experts: ExpertLayers | None = None  # None: the stacked parameters

    def set_experts(self, experts: ExpertLayers) -> None:
        """Run the experts through ``experts``; the stacked parameters are released."""
        assert len(experts.gate_up) == self.num_experts
        self.experts = experts
        self.w_gate_up = nn.Parameter(self.w_gate_up.new_empty((0,)), requires_grad=False)
        self.w_down = nn.Parameter(self.w_down.new_empty((0,)), requires_grad=False)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e``'s MLP on its tokens ``x`` (before the routing weight)."""
        if self.experts is not None:
            gate, up = self.experts.gate_up[e](x).chunk(2, dim=-1)
            return self.experts.down[e](self.act(gate) * up)
        gate, up = F.linear(x, self.w_gate_up[e]).chunk(2, dim=-1)
        return F.linear(self.act(gate) * up, self.w_down[e])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        flat_experts = experts.flatten()
        counts = torch.bincount(flat_experts, minlength=self.num_experts)
        self.expert_counts += counts
        # Stable sort keeps each expert's tokens in token order.
        order = torch.argsort(flat_experts, stable=True)
        flat_weights = weights.flatten()
        out = torch.zeros_like(x)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n == 0:
                continue
            picks = order[start : start + n]
            start += n
            tokens = picks // self.top_k
            y = (self._expert(e, x[tokens]) * flat_weights[picks, None]).to(x.dtype)
            out.index_add_(0, tokens, y)
        if self.shared_expert is not None:
            assert self.shared_expert_gate is not None  # built together with the shared expert
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
