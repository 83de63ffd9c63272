"""``[engine] kv_cache_dtype = "bfloat16"``: a float32 model's KV cache in half the bytes, read by the
fused step (its ``TK_KV_BF16`` build) and by the PyTorch forward alike."""

from __future__ import annotations

import pytest
import torch
from fused_checks import fused_and_reference, mixed_prefills, serve_and_generate

from tests.serve_configs import config as serve_config, local_model, section
from tokenops.engine.kernels import fused_decode
from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.core.config import EngineConfig

needs_lib = pytest.mark.skipif(fused_decode._library(kv_bf16=True) is None, reason="no C compiler")


def test_bfloat16_cache_holds_half_the_bytes(tiny_checkpoint, make_runner):
    full = make_runner(tiny_checkpoint("llama"), kv_cache_tokens=512)
    half = make_runner(tiny_checkpoint("llama"), kv_cache_tokens=512, kv_cache_dtype="bfloat16")
    assert half.kv_cache.dtype == torch.bfloat16 and full.kv_cache.dtype == torch.float32
    assert 2 * half.kv_cache_bytes == full.kv_cache_bytes
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="float8")


@needs_lib
@pytest.mark.parametrize("arch", ["llama", "qwen2_sliding"])
@pytest.mark.parametrize("threads", [1, 3])
def test_fused_step_on_a_bfloat16_cache_matches_the_pytorch_forward(arch, threads, tiny_checkpoint, make_runner):
    """Prefills (attention split by rows), a prefill after a cached prefix, decodes and a verify chunk:
    the fused step and the PyTorch forward write the same rounded K/V and get the same logits."""
    runner = make_runner(tiny_checkpoint(arch), decode_kernel="native", block_size=4, kv_cache_tokens=1024,
                         weight_layout="plain", kv_cache_dtype="bfloat16")
    assert runner.fused_decode is not None and runner.kv_cache.dtype == torch.bfloat16
    prompts, tables = mixed_prefills(runner.vocab_size, seed=5)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        steps = [[ChunkInput(p, 0, t) for p, t in zip(prompts, tables)],
                 [ChunkInput(prompts[0][:40], 70, tables[0]), ChunkInput([5], 9, tables[1]),
                  ChunkInput([6, 7, 8, 9], 130, tables[2], num_logits=4), ChunkInput([3], 17, tables[3])],
                 [ChunkInput([4], 110, tables[0]), ChunkInput([8], 10, tables[1])]]
        for chunks in steps:
            assert runner.fused_decode.accepts(chunks)
            fused, reference, cache = fused_and_reference(runner, chunks)
            torch.testing.assert_close(fused, reference, atol=3e-4, rtol=1e-4)
            # the same values rounded to bfloat16: equal but where float32 rounding straddles a bfloat16 step
            differ = (cache != runner.kv_cache).sum().item()
            assert differ <= cache.numel() // 1000, differ
            torch.testing.assert_close(cache.float(), runner.kv_cache.float(), atol=1e-5, rtol=8e-3)
    finally:
        torch.set_num_threads(saved)


@needs_lib
def test_bfloat16_cache_changes_logits_by_its_rounding_only(tiny_checkpoint, make_runner):
    """Against the float32 cache the logits move by about bfloat16's step (2^-8 of a value), not more."""
    logits = {}
    for kv in ("auto", "bfloat16"):
        runner = make_runner(tiny_checkpoint("llama"), decode_kernel="native", block_size=4, kv_cache_tokens=512,
                             kv_cache_dtype=kv)
        prompt = list(range(3, 60))
        runner.execute([ChunkInput(prompt, 0, list(range(15)))])
        logits[kv] = runner.execute([ChunkInput([7], len(prompt), list(range(15)))])
    diff = (logits["auto"] - logits["bfloat16"]).abs().max().item()
    assert 0 < diff < 0.05 * logits["auto"].abs().max().item()


def test_serve_with_a_bfloat16_cache(tmp_path, tiny_llama_dir):
    """``tokenops serve`` with ``[plugins.kv_policy] cache_dtype = "bfloat16"`` streams through the fused
    step and answers what the same engine generates in process."""
    prompt = "the cache holds half the bytes " * 5
    config = serve_config(local_model("tiny", tiny_llama_dir), section("plugins.kv_policy", cache_dtype="bfloat16"))
    text, stats, reference = serve_and_generate(
        tmp_path, config, prompt, EngineConfig(model=str(tiny_llama_dir), device="cpu", kv_cache_dtype="bfloat16"))
    assert [e["kv_dtype"] for e in stats["engines"].values()] == ["bfloat16"], stats["engines"]
    engines = [e for e in stats["engines"].values() if "fused_decode_steps" in e]
    if fused_decode._library(kv_bf16=True) is not None:
        assert engines and engines[0]["fused_decode_steps"] >= 16, stats["engines"]
    assert text == reference
