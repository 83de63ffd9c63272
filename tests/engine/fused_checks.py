"""Set-ups shared by the fused step's tests (test_fused_decode.py) and the bfloat16 KV cache's
(test_kv_bfloat16.py), which check the same step on another cache: written once so the two cannot
drift apart (a changed prompt mix or reference path would otherwise be changed in one only)."""

from __future__ import annotations

import httpx
import openai
import torch

from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.testing_serve import ServeProcess

#: Prompt lengths of a mixed prefill: 70 and 130 split attention rows between threads (over 16
#: tokens, blocks of 64 rows) and cross qwen2_sliding's window; 9 and 17 stay short.
MIXED_LENGTHS = (70, 9, 130, 17)


def mixed_prefills(vocab: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Four seeded random prompts of :data:`MIXED_LENGTHS` tokens and their block tables (block size 4,
    with room for the tokens the tests append)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in MIXED_LENGTHS]
    tables = [list(range(0, 60)), list(range(60, 70)), list(range(70, 130)), list(range(130, 145))]
    return prompts, tables


def fused_and_reference(runner, chunks: list[ChunkInput]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fused logits, PyTorch-forward logits, the KV cache as the fused step left it) of one step; the
    forward rewrites the same K/V slots, so ``runner.kv_cache`` afterwards is the reference cache."""
    fused = runner.fused_decode(chunks)
    cache = runner.kv_cache.clone()
    saved, runner.fused_decode = runner.fused_decode, None
    try:
        reference = runner.execute(chunks)
    finally:
        runner.fused_decode = saved
    return fused, reference, cache


def serve_and_generate(tmp_path, config: str, prompt, engine_config: EngineConfig) -> tuple[str, dict, str]:
    """Stream 16 greedy tokens of ``prompt`` from model ``tiny`` of a real ``tokenops serve`` with
    ``config``; (its text, its /admin/stats, what an in-process engine of ``engine_config`` generates)."""
    with ServeProcess(tmp_path, config=config, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        stream = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=16, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        stats = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json()
    engine = LLMEngine(engine_config)
    reference = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    return text, stats, reference.outputs[0].text
