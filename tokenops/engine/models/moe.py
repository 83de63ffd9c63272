"""Sparse mixture-of-experts feed-forward block (Mixtral, Qwen2-MoE, Qwen3-MoE).

Routing: softmax over the router logits, top-k, optional renormalisation of the k
weights (always for Mixtral, ``norm_topk_prob`` for Qwen). Qwen2-MoE adds a shared
expert whose output is scaled by ``sigmoid(shared_expert_gate(x))``.

Expert weights are stacked (``w_gate_up [E, 2I, H]``, ``w_down [E, H, I]``); tokens are
sorted by expert so each expert runs one matmul over all its tokens. The per-expert
counts that drive that loop are also accumulated into :attr:`expert_counts`, the
routed-token counter the engine reports as expert load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenops.engine.models.args import ModelArgs
from tokenops.engine.models.layers import GatedMLP, Linear, activation


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
            gate, up = F.linear(x[tokens], self.w_gate_up[e]).chunk(2, dim=-1)
            y = F.linear(self.act(gate) * up, self.w_down[e])
            y = (y * flat_weights[picks, None]).to(x.dtype)
            out.index_add_(0, tokens, y)
        if self.shared_expert is not None:
            assert self.shared_expert_gate is not None  # built together with the shared expert
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
