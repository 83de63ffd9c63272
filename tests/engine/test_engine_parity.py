"""The whole engine against Hugging Face ``generate`` (greedy) on tiny random checkpoints:
several requests batched, chunked prefill, a forced preemption, prefix-cache hits, and
identical output with prefix caching on and off."""

from __future__ import annotations

import pytest
import torch

from tiny_models import load_hf_model
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.sampling.sampling import SamplingParams

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "qwen2_sliding", "mixtral", "qwen2_moe")
NUM_NEW = 10
BLOCK = 4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on a shared 2-core box run many times faster single-threaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def prompts() -> list[list[int]]:
    """Four prompts sharing an 18-token prefix (prefix-cache hits), 23 to 33 tokens long."""
    g = torch.Generator().manual_seed(11)
    shared = torch.randint(0, 300, (18,), generator=g).tolist()
    return [shared + torch.randint(0, 300, (5 + 3 * i,), generator=g).tolist() for i in range(4)]


@torch.no_grad()
def hf_greedy(hf, ids: list[int]) -> list[int]:
    hf.generation_config.eos_token_id = None
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      do_sample=False, max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, pad_token_id=0)
    return out[0, len(ids):].tolist()


def run_engine(path, caching: bool, kv_blocks: int, budget: int) -> tuple[list[list[int]], dict]:
    config = EngineConfig(model=str(path), device="cpu", torch_threads=1, block_size=BLOCK, kv_cache_tokens=kv_blocks * BLOCK,
                          max_num_batched_tokens=budget, max_num_seqs=4, enable_prefix_caching=caching)
    engine = LLMEngine(config)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)
    first = engine.generate(prompts(), params)
    again = engine.generate(prompts()[:2], params)  # the whole prompt is cached now
    outs = [o.outputs[0].token_ids for o in first + again]
    assert all(o.outputs[0].finish_reason == "length" for o in first + again)
    bm = engine.scheduler.block_manager
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks
    return outs, engine.stats()


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_greedy_equals_hf_generate(arch, tiny_checkpoint):
    path = tiny_checkpoint(arch)
    hf = load_hf_model(path)
    expected = [hf_greedy(hf, p) for p in prompts()]
    expected += expected[:2]
    # 20 blocks of 4 tokens: two sequences of ~40 tokens cannot both grow, so one is preempted
    cached, cached_stats = run_engine(path, caching=True, kv_blocks=20, budget=16)
    uncached, uncached_stats = run_engine(path, caching=False, kv_blocks=20, budget=16)
    assert cached == expected, f"{arch}: prefix caching on"
    assert uncached == expected, f"{arch}: prefix caching off"
    assert cached_stats["prefix_cache_hits"] >= 2 * 28  # the repeated prompts hit all but their last block
    assert uncached_stats["prefix_cache_hits"] == 0
    assert cached_stats["num_preemptions"] + uncached_stats["num_preemptions"] > 0
    if arch in ("mixtral", "qwen2_moe"):
        load = cached_stats["expert_load"]
        assert load is not None and sum(map(sum, load)) > 0
    else:
        assert cached_stats["expert_load"] is None
