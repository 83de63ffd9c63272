"""Engine features on LoRA adapter rows (issue 40): speculative decoding (n-gram), preemption by
recompute and structured outputs (a JSON schema's grammar) give each adapter row the tokens it gets
without them, in batches that mix the base and two random peft adapters (tiny Llama, CPU). The
adapter rows' own greedy tokens equal peft's merged model's (test_lora.py), so equal here means
right."""

from __future__ import annotations

import json

import pytest
import torch

from test_lora import ADAPTERS, BLOCK, make_adapter
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.sampling.grammar import GrammarSpec
from tokenops.engine.sampling.sampling import SamplingParams

peft = pytest.importorskip("peft")
NAMES = [None, "alpha", "beta"]
#: repetitive prompts (the n-gram proposer finds matches in them) and a plain one
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [10, 11, 12, 13] * 5 + [10], list(range(20, 44))]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_features")
    return {name: make_adapter(tiny_llama_dir, root / name, *spec) for name, spec in ADAPTERS.items()}


def engine_with(base_dir, adapters, **kw) -> LLMEngine:
    config = dict(model=str(base_dir), device="cpu", torch_threads=1, block_size=BLOCK, kv_cache_tokens=128 * BLOCK,
                  max_num_batched_tokens=64, max_num_seqs=16)
    engine = LLMEngine(EngineConfig(**{**config, **kw}))
    for name, path in adapters.items():
        engine.load_lora(name, str(path))
    return engine


def run(engine: LLMEngine, params: SamplingParams | list[SamplingParams]) -> dict:
    """Every prompt under the base and each adapter, in one batch: tokens per (adapter, prompt)."""
    batch = [(n, i) for n in NAMES for i in range(len(PROMPTS))]
    outs = engine.generate([PROMPTS[i] for _, i in batch], params, loras=[n for n, _ in batch])
    return {key: o.outputs[0].token_ids for key, o in zip(batch, outs)}


@pytest.fixture(scope="module")
def plain(tiny_llama_dir, adapters):
    """The reference: greedy tokens without speculation, preemption or grammar."""
    engine = engine_with(tiny_llama_dir, adapters)
    got = run(engine, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for i in range(len(PROMPTS)):  # the adapters change the output (else equality proves nothing)
        assert got[("alpha", i)] != got[(None, i)] and got[("beta", i)] != got[(None, i)]
    return got


def test_ngram_speculation_on_adapter_rows_keeps_their_greedy_tokens(tiny_llama_dir, adapters, plain):
    engine = engine_with(tiny_llama_dir, adapters, speculative="ngram", num_speculative_tokens=3)
    assert run(engine, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)) == plain
    spec, lora = engine.stats()["spec_decode"], engine.stats()["lora"]
    assert spec["num_drafts"] > 0 and spec["num_accepted_tokens"] > 0
    assert lora["fused_steps"] == lora["steps"] > 0  # the verify steps ran adapter rows on the fused step


def test_preempted_adapter_rows_recompute_with_their_adapter(tiny_llama_dir, adapters, plain):
    # 9 sequences of up to 44 tokens in 40 blocks of 4: some are preempted and recomputed
    engine = engine_with(tiny_llama_dir, adapters, kv_cache_tokens=40 * BLOCK)
    assert run(engine, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)) == plain
    assert engine.stats()["num_preemptions"] > 0


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


def test_json_schema_on_adapter_rows_masks_the_adapters_logits(tiny_llama_dir, adapters):
    """Each constrained row decodes its own model's greedy choice among the tokens the grammar allows:
    the same tokens in a mixed batch as alone, valid JSON, and the adapters' differ from the base's."""
    engine = engine_with(tiny_llama_dir, adapters)
    compiler = engine.grammar_compiler
    matcher = compiler.compile(GrammarSpec.json_schema(SCHEMA))

    def params() -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=40, grammar=matcher.copy())

    batch = run(engine, [params() for _ in NAMES for _ in PROMPTS])
    alone = {}
    for name in NAMES:
        out = engine.generate([PROMPTS[0]], params(), loras=[name])
        alone[name] = out[0].outputs[0].token_ids
    assert {n: batch[(n, 0)] for n in NAMES} == alone
    tok = engine.tokenizer
    texts = {key: tok.decode(ids) for key, ids in batch.items()}
    for key, text in texts.items():
        value = json.loads(text)
        assert set(value) == {"n", "ok"}, (key, text)
    assert any(texts[("alpha", i)] != texts[(None, i)] for i in range(len(PROMPTS)))
    assert engine.stats()["lora"]["fused_steps"] > 0
