"""ModelRunner: plugin hooks, KV cache geometry, copy-on-write blocks, limits."""

from __future__ import annotations

import pytest
import torch

from tokenops import hookimpl
from tokenops.engine.core.batch import ChunkInput
from tokenops.plugin_manager import register_plugin, unregister_plugin


def test_attributes_and_cache_geometry(tiny_llama_dir, make_runner):
    runner = make_runner(tiny_llama_dir, block_size=4, kv_cache_tokens=100)
    assert runner.num_blocks == 25 and runner.block_size == 4
    assert runner.max_model_len == 100  # capped by the KV cache (model allows 256)
    assert runner.device == torch.device("cpu") and runner.vocab_size == 320
    assert runner.hf_config["model_type"] == "llama" and runner.model_name == "llama"
    args = runner.args
    assert runner.kv_cache.shape == (2, args.num_layers, 25, 4, args.num_kv_heads, args.head_dim)
    assert runner.execute([]).shape == (0, 320)


def test_max_model_len_limits(tiny_llama_dir, make_runner):
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings 256"):
        make_runner(tiny_llama_dir, max_model_len=1000, kv_cache_tokens=2048)
    runner = make_runner(tiny_llama_dir, max_model_len=8)
    with pytest.raises(ValueError, match="exceeds max_model_len 8"):
        runner.execute([ChunkInput(list(range(9)), 0, [0, 1, 2])])
    with pytest.raises(ValueError, match="cannot hold"):
        runner.execute([ChunkInput(list(range(6)), 0, [0])])


def test_copy_block_forks_a_sequence(tiny_llama_dir, make_runner):
    """A fork that copies the partly filled last block continues exactly like the original."""
    runner = make_runner(tiny_llama_dir)
    ids = list(range(20, 30))  # 10 tokens: blocks 0, 1 full, block 2 half full
    runner.execute([ChunkInput(ids, 0, [0, 1, 2])])
    runner.copy_block(2, 7)
    original = runner.execute([ChunkInput([42], 10, [0, 1, 2])])[0]
    forked = runner.execute([ChunkInput([42], 10, [0, 1, 7])])[0]
    torch.testing.assert_close(forked, original)
    other = runner.execute([ChunkInput([43], 10, [0, 1, 5])])[0]  # block 5 never written
    assert not torch.allclose(other, original)


def test_prefix_reuse_across_sequences(tiny_llama_dir, make_runner):
    """Two sequences sharing cached prefix blocks (prefix caching) see the same logits
    as a full recompute."""
    runner = make_runner(tiny_llama_dir)
    prefix, tail = list(range(50, 58)), [7, 8, 9]
    full = runner.execute([ChunkInput(prefix + tail, 0, [0, 1, 2])])[0]
    reused = runner.execute([ChunkInput(tail, 8, [0, 1, 9])])[0]
    torch.testing.assert_close(reused, full, atol=1e-5, rtol=1e-5)


class _Hooks:
    def __init__(self):
        self.calls = []

    @hookimpl
    def tokenops_transform_model(self, model, config):
        self.calls.append(("transform", type(model).__name__, config.block_size))
        return None

    @hookimpl
    def tokenops_compile_model(self, model):
        self.calls.append(("compile", type(model).__name__))
        return _Scaled(model)


class _Scaled(torch.nn.Module):
    """A 'compiled' wrapper that doubles the logits, to prove the runner uses it."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return 2 * self.inner(*args)


def test_transform_and_compile_hooks(tiny_llama_dir, make_runner):
    """The hooks reach the runner as the engine's policies, collected once (serve's way)."""
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner
    from tokenops.policy_hooks import collect_policies

    plain = make_runner(tiny_llama_dir).execute([ChunkInput([1, 2, 3], 0, [0])])[0]
    plugin = _Hooks()
    name = register_plugin(plugin, name="test-engine-hooks")
    config = EngineConfig(model=str(tiny_llama_dir), device="cpu", block_size=4, kv_cache_tokens=256)
    try:
        policies = collect_policies(config)
        assert plugin.calls == []  # collected, not called yet
        runner = ModelRunner(config, policies.transforms, policies.compile)
    finally:
        unregister_plugin(name)
    assert plugin.calls == [("transform", "CausalLM", 4), ("compile", "CausalLM")]
    hooked = runner.execute([ChunkInput([1, 2, 3], 0, [0])])[0]
    torch.testing.assert_close(hooked, 2 * plain)
    # without policies the runner neither transforms nor compiles (no plugin machinery)
    torch.testing.assert_close(make_runner(tiny_llama_dir).execute([ChunkInput([1, 2, 3], 0, [0])])[0], plain)


def test_split_by_length_groups_similar_lengths():
    from tokenops.engine.kernels.attention_metadata import split_by_length

    assert split_by_length([]) == []
    assert split_by_length([10, 9, 9, 8]) == [(0, 4)]  # padding cheaper than another call
    groups = split_by_length([900, 880, 870, 100, 90, 20])
    assert groups[0] == (0, 3) and groups[-1][1] == 6
    big = split_by_length(list(range(200, 0, -1)))
    assert big[0][0] == 0 and big[-1][1] == 200 and all(a < b for a, b in big)


def test_decode_groups_give_the_same_logits(tiny_llama_dir, make_runner, monkeypatch):
    """Decodes split into several padded groups match one padded batch."""
    import tokenops.engine.kernels.attention_metadata as attention

    runner = make_runner(tiny_llama_dir)
    lengths = [3, 25, 9, 17, 2]
    tables = [[8 * i + j for j in range(8)] for i in range(len(lengths))]
    for n, table in zip(lengths, tables):
        runner.execute([ChunkInput(list(range(1, n + 1)), 0, table)])
    step = [ChunkInput([7], n, table) for n, table in zip(lengths, tables)]
    monkeypatch.setattr(attention, "split_by_length", lambda ls: [(0, len(ls))] if ls else [])
    single = runner.execute(step)
    monkeypatch.setattr(attention, "split_by_length", lambda ls: [(i, i + 1) for i in range(len(ls))])
    grouped = runner.execute(step)
    torch.testing.assert_close(grouped, single, atol=1e-5, rtol=1e-5)
