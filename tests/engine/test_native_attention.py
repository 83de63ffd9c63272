"""The compiled paged decode kernel (tokenops.engine.kernels.native) against the PyTorch path."""

from __future__ import annotations

import pytest
import torch
from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.kernels import native, switches
from tokenops.engine.kernels.attention import AttentionMetadata, paged_attention
from tokenops.engine.sampling.sampling import SamplingParams

kernel = native.get_kernel()
needs_kernel = pytest.mark.skipif(kernel is None, reason="no C compiler: the engine uses the PyTorch path")


def _case(dtype, num_heads, num_kv_heads, evict: bool, seed: int = 0):
    """A cache with random contents, decodes of mixed lengths and one prefill chunk."""
    g = torch.Generator().manual_seed(seed)
    block_size, num_blocks, head_dim = 4, 64, 16
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    chunks, used = [], 0
    for length in (23, 9, 2, 17):  # decodes: the new token is the last of `length`
        n = (length + block_size - 1) // block_size
        table = perm[used:used + n]
        used += n
        if evict and length > 12:
            table[1] = -1  # a block evicted by a KV policy is skipped
        chunks.append(ChunkInput([1], length - 1, table))
    table = perm[used:used + 4]
    chunks.append(ChunkInput([1, 2, 3], 10, table))  # a prefill chunk with cached context
    num_tokens = sum(c.num_tokens for c in chunks)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=g).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g).to(dtype)
    return chunks, block_size, q, k, v, k_cache, v_cache


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (4, 1)])
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("evict", [False, True])
def test_kernel_matches_gather_and_sdpa(dtype, heads, window, evict):
    chunks, block_size, q, k, v, k_cache, v_cache = _case(dtype, *heads, evict)
    ref_meta = AttentionMetadata.build(chunks, block_size, q.device, {window}, dtype)
    nat_meta = AttentionMetadata.build(chunks, block_size, q.device, {window}, dtype, native=kernel)
    assert nat_meta.native is kernel and not nat_meta.decode_groups and ref_meta.native is None
    kc1, vc1, kc2, vc2 = k_cache.clone(), v_cache.clone(), k_cache.clone(), v_cache.clone()
    ref = paged_attention(q, k, v, kc1, vc1, ref_meta, 0.25, window)
    got = paged_attention(q, k, v, kc2, vc2, nat_meta, 0.25, window)
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)  # both wrote the step's K/V
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


@needs_kernel
def test_kernel_is_used_and_engine_output_is_identical(tiny_llama_dir):
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 30, 2)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def run(backend):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), device="cpu", block_size=4, kv_cache_tokens=512,
                                        max_num_batched_tokens=16, attention_backend=backend))
        used = engine.runner.native_attention
        return [o.outputs[0].token_ids for o in engine.generate(prompts, params)], used

    torch_out, torch_used = run("torch")
    native_out, native_used = run("native")
    assert torch_used is None and native_used is kernel
    assert native_out == torch_out


def test_backend_validation(tiny_llama_dir):
    with pytest.raises(ValueError, match="attention_backend"):
        EngineConfig(attention_backend="cuda-graphs")
    with pytest.raises(ValueError, match="attention_backend 'native' is unavailable"):
        LLMEngine(EngineConfig(model=str(tiny_llama_dir), device="cpu", block_size=4, kv_cache_tokens=256,
                               kv_cache_dtype="int8", attention_backend="native"))


def test_disabled_by_environment_or_missing_compiler(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_kernels", {})
    monkeypatch.setattr(switches, "current", switches.KernelSwitches(native_kernels=False))
    assert native.get_kernel() is None and native.disabled()
    monkeypatch.setattr(switches, "current", switches.KernelSwitches())
    monkeypatch.setattr(native, "_kernels", {})
    monkeypatch.setenv("TOKENOPS_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert native.get_kernel() is None  # logged, and the engine keeps the PyTorch path
    with pytest.raises((RuntimeError, OSError)):
        native.build_library(str(tmp_path / "no-such-cc"))


def test_backend_comes_from_settings():
    from tokenops.config import EngineSettings

    assert EngineConfig.from_settings(EngineSettings(attention_backend="torch")).attention_backend == "torch"
    assert EngineConfig.from_settings(EngineSettings()).attention_backend == "auto"
