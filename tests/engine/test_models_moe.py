"""MoE routing counters and the shapes of MoE models."""

from __future__ import annotations

import pytest
import torch

from tiny_models import MOE_ARCHS
from tokenops.engine.core.batch import ChunkInput


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_expert_counters_sum_to_tokens_times_top_k(arch, tiny_checkpoint, make_runner):
    runner = make_runner(tiny_checkpoint(arch))
    assert runner.is_moe
    args = runner.args
    assert runner.expert_load() == [[0] * args.num_experts for _ in range(args.num_layers)]
    runner.execute([ChunkInput(list(range(10, 21)), 0, [0, 1, 2]), ChunkInput(list(range(30, 37)), 0, [3, 4])])
    runner.execute([ChunkInput([5], 11, [0, 1, 2]), ChunkInput([6], 7, [3, 4])])
    load = runner.expert_load()
    num_tokens = 11 + 7 + 2
    assert len(load) == args.num_layers and all(len(row) == args.num_experts for row in load)
    for layer, row in enumerate(load):
        expected = num_tokens * args.num_experts_per_tok if args.moe_layers[layer] else 0
        assert sum(row) == expected, (layer, row)
    # Random routing over 20 tokens x top-2 reaches more than one expert.
    assert max(sum(1 for n in row if n) for row in load) > 1
    runner.reset_expert_load()
    assert all(sum(row) == 0 for row in runner.expert_load())


def test_qwen2_moe_dense_layer_from_mlp_only_layers(tiny_checkpoint, make_runner):
    runner = make_runner(tiny_checkpoint("qwen2_moe"))
    assert runner.args.moe_layers == [True, False]
    blocks = runner.model.moe_blocks()
    assert blocks[0] is not None and blocks[0].shared_expert is not None and blocks[1] is None
    assert runner.args.norm_topk_prob is False


def test_dense_model_has_no_expert_load(tiny_llama_dir, make_runner):
    runner = make_runner(tiny_llama_dir)
    assert not runner.is_moe and runner.expert_load() is None


def test_moe_block_routes_like_a_dense_reference():
    """The sorted-by-expert loop equals a per-token reference computation."""
    from tokenops.engine.models.args import ModelArgs
    from tokenops.engine.models.moe import SparseMoeBlock

    args = ModelArgs(architecture="MixtralForCausalLM", model_type="mixtral", vocab_size=10, hidden_size=8,
                     intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4, rms_norm_eps=1e-6,
                     max_position_embeddings=32, rope_theta=1e4, num_experts=3, num_experts_per_tok=2,
                     moe_intermediate_size=6, norm_topk_prob=True)  # fmt: skip
    torch.manual_seed(0)
    block = SparseMoeBlock(args)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(5, 8)
    out = block(x)
    probs = torch.softmax(block.gate(x), -1)
    ref = torch.zeros_like(x)
    for t in range(5):
        w, e = probs[t].topk(2)
        w = w / w.sum()
        for wi, ei in zip(w, e):
            g, u = (block.w_gate_up[ei] @ x[t]).chunk(2)
            ref[t] += wi * (block.w_down[ei] @ (torch.nn.functional.silu(g) * u))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert int(block.expert_counts.sum()) == 10
