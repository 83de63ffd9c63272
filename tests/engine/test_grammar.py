"""Grammar-constrained decoding in the engine (tokenops/engine/sampling/grammar.py): compile and
cache, masks applied to the constrained rows only, matchers advanced per token, the
budget-aware close, ``n > 1`` and speculative decoding beside constrained rows."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from tokenops.backends.local_structured import close_objects
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.sampling.grammar import GrammarError, GrammarSpec, apply_token_bitmasks, new_bitmask
from tokenops.engine.sampling.sampling import Sampler, SamplingParams
from tokenops.engine.core.sequence import Sequence

DEMO = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models"

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"enum": ["Paris", "Tokyo", "Lima"]},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "city", "tags"]}


@pytest.fixture(scope="module")
def demo_engine():
    return LLMEngine(EngineConfig(model=str(DEMO / "target"), device="cpu"))


def _prompts(engine, n):
    tok = engine.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Describe person {i} as JSON."}]),
                       add_special_tokens=False) for i in range(n)]


def test_compiled_grammars_are_cached_and_matchers_independent(demo_engine):
    compiler = demo_engine.grammar_compiler
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"cache_probe": {"type": "boolean"}}})
    before = compiler.num_compiled
    a, b = compiler.compile(spec), compiler.compile(spec)
    assert compiler.num_compiled == before + 1 and compiler.num_cache_hits >= 1
    tok = demo_engine.tokenizer
    for t in tok.encode('{"cache_probe":true}', add_special_tokens=False):
        assert a.accept(t)
    assert a.is_finished and not b.is_finished  # b did not move with a


def test_a_schema_the_compiler_cannot_build_is_a_grammar_error(demo_engine):
    with pytest.raises(GrammarError, match="cannot compile"):
        demo_engine.grammar_compiler.compile(GrammarSpec.json_schema({"$ref": "#/$defs/missing"}))
    with pytest.raises(GrammarError):
        demo_engine.grammar_compiler.compile(GrammarSpec("lark", "start: ( unclosed"))


def test_masks_touch_only_the_constrained_rows():
    logits = torch.randn(3, 70)
    bitmask = new_bitmask(1, 70)
    bitmask[0] = 0
    bitmask[0, 1] = 1 << 3  # only token 35 allowed
    out = apply_token_bitmasks(logits, [1], bitmask)
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert out[1].argmax().item() == 35 and torch.isinf(out[1]).sum().item() == 69


def test_sampler_applies_each_rows_own_grammar(demo_engine):
    tok = demo_engine.tokenizer
    matcher = demo_engine.grammar_compiler.compile(GrammarSpec("lark", 'start: "yes" | "no"'))
    free = Sequence("free", [1, 2], SamplingParams(temperature=0))
    constrained = Sequence("c", [1, 2], SamplingParams(temperature=0, grammar=matcher))
    logits = torch.randn(2, demo_engine.runner.vocab_size)
    out = Sampler().sample(logits, [free, constrained])
    assert out[0].token_id == logits[0].argmax().item()
    assert tok.decode([out[1].token_id]) in ("yes", "no", "y", "n", "ye")


@pytest.mark.slow  # tests/gateway/test_structured_serve.py checks 20 prompts through tokenops serve by default
def test_twenty_prompts_give_schema_valid_json(demo_engine):
    """Even the word-salad demo model, sampled at temperature 1 (its strings never end by
    themselves), answers with JSON that validates: the budget-aware close ends them."""
    matcher = demo_engine.grammar_compiler.compile(GrammarSpec.json_schema(close_objects(PERSON)))
    outs = demo_engine.generate(_prompts(demo_engine, 20),
                                SamplingParams(max_tokens=48, temperature=1.0, seed=7, grammar=matcher))
    for out in outs:
        jsonschema.validate(json.loads(out.outputs[0].text), PERSON)
        assert out.outputs[0].finish_reason == "stop"


def test_each_of_n_sequences_decodes_under_its_own_matcher(demo_engine):
    matcher = demo_engine.grammar_compiler.compile(GrammarSpec.json_schema(close_objects(PERSON)))
    [out] = demo_engine.generate(_prompts(demo_engine, 1), SamplingParams(n=3, max_tokens=40, temperature=1.0, seed=3,
                                                                          grammar=matcher))
    assert len(out.outputs) == 3
    for c in out.outputs:
        jsonschema.validate(json.loads(c.text), PERSON)


def test_speculative_decoding_runs_beside_constrained_rows():
    """Constrained rows are not speculated (the draft proposes nothing for them); the
    other rows of the same batch still are."""
    engine = LLMEngine(EngineConfig(model=str(DEMO / "target"), device="cpu", speculative="draft",
                                    draft_model=str(DEMO / "draft"), num_speculative_tokens=3))
    matcher = engine.grammar_compiler.compile(GrammarSpec.json_schema(close_objects(PERSON)))
    prompts = _prompts(engine, 2)
    free, constrained = engine.generate(prompts, [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
                                                  SamplingParams(max_tokens=64, temperature=0, grammar=matcher)])
    jsonschema.validate(json.loads(constrained.outputs[0].text), PERSON)
    assert len(free.outputs[0].token_ids) == 24
    assert engine.stats()["spec_decode"]["num_draft_tokens"] > 0



def test_grammar_cache_is_bounded_in_bytes(demo_engine):
    from tokenops.engine.sampling.grammar import GrammarCompiler

    base = demo_engine.grammar_compiler
    compiler = GrammarCompiler(base._tokenizer_json, base.vocab_size, base._eos)
    specs = [GrammarSpec.json_schema({"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                                      "required": [f"k{i}"]}) for i in range(6)]
    compiler.max_cache_bytes = 4 * specs[0].num_bytes  # room for four entries: a spec over a quarter is not kept
    for spec in specs:
        compiler.compile(spec)
    assert compiler.num_cache_bytes <= compiler.max_cache_bytes and len(compiler._cache) == 4
    assert compiler.num_cache_bytes == sum(s.num_bytes for s in compiler._cache)
    huge = GrammarSpec.json_schema({"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(400)}})
    compiler.compile(huge)
    assert huge not in compiler._cache  # bigger than a quarter of the budget: compiled, not kept
    compiler.close()
