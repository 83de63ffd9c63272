"""KV-cache options: int8 storage and sink + window eviction (tiny random Llama, CPU)."""

from __future__ import annotations

import pytest
import torch

from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.kv.kv_quant import dequantize_kv, kv_bytes_per_token, quantize_kv
from tokenops.engine.sampling.sampling import SamplingParams


def test_quantize_roundtrip_error_is_half_a_step():
    x = torch.randn(50, 4, 32) * torch.rand(50, 4, 1) * 10
    q, scale = quantize_kv(x)
    assert q.dtype == torch.int8 and scale.shape == (50, 4)
    err = (dequantize_kv(q, scale, torch.float32) - x).abs()
    assert bool((err <= scale.unsqueeze(-1) * 0.5 + 1e-6).all())
    assert kv_bytes_per_token(2, 2, 32, torch.float32, "int8") * 128 // 36 == kv_bytes_per_token(2, 2, 32, torch.float32)


def _steps(runner):
    """Two sequences: prefill, a chunked continuation, then decodes (cache reads)."""
    a, b = list(range(0, 8)), list(range(8, 16))
    out = [runner.execute([ChunkInput(list(range(5, 25)), 0, a), ChunkInput(list(range(30, 37)), 0, b)])]
    out.append(runner.execute([ChunkInput([7], 20, a), ChunkInput(list(range(40, 44)), 7, b)]))
    for i in range(4):
        out.append(runner.execute([ChunkInput([9 + i], 21 + i, a), ChunkInput([3 + i], 11 + i, b)]))
    return torch.cat(out)


def test_int8_kv_logits_close_to_full_precision(tiny_llama_dir, make_runner):
    # the same arithmetic on both sides: an int8 cache has no fused step, which the float32 runner
    # would otherwise take for every step (and whose packed weights its linear layers would use)
    full = make_runner(tiny_llama_dir, weight_layout="plain", decode_kernel="torch")
    int8 = make_runner(tiny_llama_dir, kv_cache_dtype="int8", weight_layout="plain")
    assert int8.kv_cache.dtype == torch.int8
    assert int8.kv_cache_bytes < full.kv_cache_bytes / 3
    ref, got = _steps(full), _steps(int8)
    assert torch.equal(ref[:2], got[:2])  # first prefill attends to its exact fresh K/V
    diff = (ref - got).abs().max().item()
    assert 0 < diff < 0.03 * ref.abs().max().item(), diff  # cache reads are quantized, but close
    probs_ref, probs = ref.softmax(-1), got.softmax(-1)
    assert (probs_ref - probs).abs().sum(-1).max().item() < 0.05


def test_int8_kv_with_speculation_and_forks(tiny_llama_dir):
    def run(**kw):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), device="cpu", block_size=4, kv_cache_tokens=256,
                                        kv_cache_dtype="int8", **kw))
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=2)
        return [c.token_ids for o in engine.generate([[5, 6, 7, 5, 6, 7, 5], [9, 8]], params) for c in o.outputs]

    base = run()
    assert base[0] == base[1]  # greedy siblings after copy-on-write agree (scales copied too)
    assert run(speculative="ngram") == base


def _generate_long(model_dir, max_tokens, **kw):
    engine = LLMEngine(EngineConfig(model=str(model_dir), device="cpu", block_size=4, kv_cache_tokens=1024,
                                    max_num_batched_tokens=32, **kw))
    for i in range(3):
        engine.add_request(f"r{i}", [5 + i, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                       ignore_eos=True))
    peak, peak_per_seq, outs = 0, 0, {}
    bm = engine.scheduler.block_manager
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0].token_ids
        peak = max(peak, bm.num_used_blocks)
        for seq in engine.scheduler.running:
            if not seq.is_prefill:
                peak_per_seq = max(peak_per_seq, sum(1 for b in seq.block_table if b >= 0))
        bm.check_invariants([s.block_table for s in engine.scheduler.running])
    return [outs[f"r{i}"] for i in range(3)], peak, peak_per_seq, engine


def test_sink_window_keeps_generating_with_bounded_blocks(tiny_llama_dir):
    from tokenops.engine.core.policies import SinkWindowPolicy

    base, base_peak, _, _ = _generate_long(tiny_llama_dir, 80)
    outs, peak, per_seq, engine = _generate_long(tiny_llama_dir, 80, kv_sink_tokens=4, kv_window_tokens=16)
    assert [len(o) for o in outs] == [80] * 3
    assert per_seq <= SinkWindowPolicy(4, 16).max_blocks(4) + 1  # +1: the slot of the token being computed
    assert peak <= 3 * (SinkWindowPolicy(4, 16).max_blocks(4) + 1) < base_peak / 2
    assert engine.stats()["kv_policy_evicted_blocks"] > 0
    # until the first eviction (context 5 + 18 tokens) the outputs are the full-cache ones
    assert all(o[:18] == b[:18] for o, b in zip(outs, base))
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_sink_window_policy_blocks():
    from tokenops.engine.core.policies import SinkWindowPolicy

    policy = SinkWindowPolicy(num_sink_tokens=4, window=8)
    table = list(range(10))
    # 30 tokens, block 4: sink = block 0; window starts at 22 -> blocks 1..4 end at or before 20
    assert policy.blocks_to_evict(30, 4, table) == [1, 2, 3, 4]
    table[1] = table[2] = -1
    assert policy.blocks_to_evict(30, 4, table) == [3, 4]
    assert policy.blocks_to_evict(10, 4, list(range(3))) == []


def test_config_rejects_bad_kv_options():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="kv_window_tokens"):
        EngineConfig(block_size=16, kv_window_tokens=8)
    with pytest.raises(ValueError, match="draft"):
        EngineConfig(kv_window_tokens=64, speculative="draft", draft_model="x")


def test_sink_window_with_ngram_speculation_and_int8(tiny_llama_dir):
    from tokenops.engine.core.policies import SinkWindowPolicy

    outs, _, per_seq, engine = _generate_long(tiny_llama_dir, 40, kv_sink_tokens=4, kv_window_tokens=16,
                                              speculative="ngram", kv_cache_dtype="int8")
    assert [len(o) for o in outs] == [40] * 3
    assert per_seq <= SinkWindowPolicy(4, 16).max_blocks(4) + 1
    assert engine.stats()["kv_policy_evicted_blocks"] > 0
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_kv_plugin_settings_reach_the_engine_config():
    from tokenops_plugins.model_optimization.kv_policy import KvPolicy
    plugin = KvPolicy()

    class Settings:
        def plugin_settings(self, name):
            return {"sink_tokens": 4, "window_tokens": 64, "cache_dtype": "int8"} if name == "kv_policy" else {}

    saved = dict(plugin.conf)
    try:
        plugin.tokenops_configure(Settings())
        config = EngineConfig()
        plugin.tokenops_engine_config(config)
        assert (config.kv_sink_tokens, config.kv_window_tokens, config.kv_cache_dtype) == (4, 64, "int8")
        from tokenops.engine.core.policies import builtin_kv_policy

        policy = builtin_kv_policy(config)  # the engine's built-in policy reads those settings
        assert (policy.num_sink_tokens, policy.window) == (4, 64)
        assert builtin_kv_policy(EngineConfig()) is None
    finally:
        plugin.conf.clear()
        plugin.conf.update(saved)
