"""The engine's features on a quantized model (issue 35, item 2).

A tiny random Llama written as a Q4_1 GGUF (``tiny_gguf.py``; output tied to the embedding, as the
default SmolLM2 file has it) runs through the quantized kernels inside the fused step, the path the
default model takes. Each test makes one feature act on it and checks what it promises: prefix-cache
hits counted and the same output; preemption happening and the unpreempted greedy output; requests
joining a running batch getting their solo output; an int8 KV cache staying close; n-gram and draft
speculation (the draft another quantized file with the same tokenizer) giving the plain greedy output;
grammars respected beside speculated rows; the KV offload tier saving and restoring blocks.
"""

from __future__ import annotations

import json

import pytest
import torch

from tiny_gguf import write_tiny_gguf
from tokenops.engine.kernels import quant_kernels
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.sampling.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: the model is tiny, and on a loaded 2-core box two threads mostly wait on
    each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """The target (Q4_1, tied output) and a draft with the same tokenizer (Q8_0, other weights)."""
    folder = tmp_path_factory.mktemp("gguf-features")
    target = write_tiny_gguf(folder / "target.gguf", "llama", "Q4_1", tied=True)
    draft = write_tiny_gguf(folder / "draft.gguf", "llama", "Q8_0", seed=3, tied=True)
    return target, draft


def _engine(path, **overrides) -> LLMEngine:
    values = dict(model=str(path), device="cpu", block_size=4, kv_cache_tokens=512, max_num_batched_tokens=64,
                  torch_threads=1)
    values.update(overrides)
    return LLMEngine(EngineConfig(**values))


def _prompts(num: int = 4, length: int = 11) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 250, (length + 3 * i,), generator=g).tolist() for i in range(num)]


def _tokens(outs) -> list[list[int]]:
    return [c.token_ids for o in outs for c in o.outputs]


def _assert_no_leak(engine: LLMEngine) -> None:
    bm = engine.scheduler.block_manager
    assert not engine.has_unfinished()
    bm.check_invariants([])


@pytest.fixture(scope="module")
def reference(gguf_files):
    """Greedy outputs of the plain engine (no prefix cache, a roomy pool, one request at a time)."""
    engine = _engine(gguf_files[0], enable_prefix_caching=False)
    return {tuple(p): engine.generate([p], GREEDY)[0].outputs[0].token_ids for p in _prompts()}


def test_the_quantized_model_runs_in_the_fused_step(gguf_files):
    engine = _engine(gguf_files[0])
    runner = engine.runner
    assert runner.weight_format is not None and runner.weight_format.startswith("gguf Q4_1")
    if quant_kernels.get_kernels() is None or not quant_kernels.get_kernels().has_avx2:
        pytest.skip("the quantized kernels need a C compiler and AVX2")
    assert runner.fused_decode is not None
    engine.generate(_prompts(2), GREEDY)
    assert runner.num_fused_steps > 0


def test_batched_prompts_get_their_solo_greedy_output(gguf_files, reference):
    engine = _engine(gguf_files[0], enable_prefix_caching=False)
    prompts = _prompts()
    assert _tokens(engine.generate(prompts, GREEDY)) == [reference[tuple(p)] for p in prompts]


def test_requests_joining_a_running_batch_get_their_solo_output(gguf_files, reference):
    """Continuous batching: the later requests enter while the first ones decode."""
    engine = _engine(gguf_files[0], enable_prefix_caching=False)
    prompts = _prompts()
    got: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    step = most_running = 0
    while pending or engine.has_unfinished():
        if pending and step % 3 == 0:
            i, p = pending.pop(0)
            engine.add_request(str(i), p, GREEDY)
        for out in engine.step():
            if out.finished:
                got[out.request_id] = out.outputs[0].token_ids
        most_running = max(most_running, engine.scheduler.num_running)
        step += 1
        assert step < 500
    assert most_running == len(prompts)  # every request joined while the others were decoding
    assert [got[str(i)] for i in range(len(prompts))] == [reference[tuple(p)] for p in prompts]
    _assert_no_leak(engine)


def test_prefix_cache_hits_are_counted_and_keep_the_output(gguf_files):
    engine = _engine(gguf_files[0])
    first = _prompts(1, length=21)[0]
    engine.generate([first], GREEDY)
    longer = first + [7, 8, 9]
    [again] = engine.generate([longer], GREEDY)
    assert again.num_cached_tokens == (len(first) // 4) * 4 > 0
    assert engine.stats()["prefix_cache_hits"] > 0
    plain = _engine(gguf_files[0], enable_prefix_caching=False)
    assert again.outputs[0].token_ids == plain.generate([longer], GREEDY)[0].outputs[0].token_ids


@pytest.mark.parametrize("speculative", [None, "ngram"])
def test_preemption_happens_and_gives_the_unpreempted_output(gguf_files, reference, speculative):
    # 22 blocks of 4 tokens cannot hold four sequences of 11-20 prompt + 12 output tokens at once
    engine = _engine(gguf_files[0], kv_cache_tokens=88, enable_prefix_caching=False, speculative=speculative)
    prompts = _prompts()
    outs = engine.generate(prompts, GREEDY)
    assert engine.stats()["num_preemptions"] > 0
    if speculative:
        assert engine.stats()["spec_decode"]["num_draft_tokens"] > 0
    assert _tokens(outs) == [reference[tuple(p)] for p in prompts]
    _assert_no_leak(engine)


@torch.no_grad()
def test_int8_kv_cache_logits_stay_close(gguf_files):
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.core.model_runner import ModelRunner

    def logits(**kw) -> torch.Tensor:
        runner = ModelRunner(EngineConfig(model=str(gguf_files[0]), device="cpu", block_size=4, kv_cache_tokens=256,
                                          decode_kernel="torch", **kw))
        ids = _prompts(1, length=17)[0]
        table = list(range(8))
        rows = [runner.execute([ChunkInput(ids[:9], 0, table)])]
        for pos in range(9, len(ids)):
            rows.append(runner.execute([ChunkInput([ids[pos]], pos, table)]))
        return torch.cat(rows)

    ref, got = logits(), logits(kv_cache_dtype="int8")
    assert torch.equal(ref[0], got[0])  # the first prefill attends to its fresh K/V
    err = (ref - got).abs().max().item() / ref.abs().max().item()
    assert 0 < err < 0.03, err
    assert (ref.softmax(-1) - got.softmax(-1)).abs().sum(-1).max().item() < 0.05


def test_int8_kv_cache_with_speculation_keeps_its_greedy_output(gguf_files):
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 40, 41]]
    base = _tokens(_engine(gguf_files[0], kv_cache_dtype="int8").generate(prompts, GREEDY))
    spec = _engine(gguf_files[0], kv_cache_dtype="int8", speculative="ngram", num_speculative_tokens=4)
    assert _tokens(spec.generate(prompts, GREEDY)) == base
    assert spec.stats()["spec_decode"]["num_drafts"] > 0


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_keeps_the_greedy_output(gguf_files, reference, method):
    target, draft = gguf_files
    extra = {"draft_model": str(draft)} if method == "draft" else {}
    engine = _engine(target, speculative=method, num_speculative_tokens=4, **extra)
    prompts = _prompts() + [[5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6]]
    outs = engine.generate(prompts, GREEDY)
    plain = _engine(target, enable_prefix_caching=False)
    assert _tokens(outs) == _tokens(plain.generate(prompts, GREEDY))
    stats = engine.stats()["spec_decode"]
    assert stats["num_drafts"] > 0 and stats["num_draft_tokens"] > 0
    _assert_no_leak(engine)


def test_verify_chunks_run_in_the_fused_quantized_step(gguf_files):
    """A verify chunk (the decode token and its k proposals, logits at every row) is one fused step over
    the packed quantized weights, like a plain decode, and each of its rows gets the logits that row
    gets decoded alone."""
    from tokenops.engine.core.batch import ChunkInput

    if quant_kernels.get_kernels() is None or not quant_kernels.get_kernels().has_avx2:
        pytest.skip("the quantized kernels need a C compiler and AVX2")
    engine = _engine(gguf_files[0], speculative="ngram", num_speculative_tokens=4)
    engine.generate([[5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6]], GREEDY)
    assert engine.stats()["spec_decode"]["num_draft_tokens"] > 0
    assert engine.runner.num_fused_steps == engine.stats()["num_steps"]  # verify steps included
    runner, ids, table = engine.runner, _prompts(1, length=14)[0], list(range(100, 104))
    runner.execute([ChunkInput(ids[:9], 0, table)])
    before = runner.num_fused_steps
    rows = runner.execute([ChunkInput(ids[9:14], 9, table, num_logits=5)])
    assert runner.num_fused_steps == before + 1 and rows.shape[0] == 5
    alone = torch.cat([runner.execute([ChunkInput([ids[pos]], pos, table)]) for pos in range(9, 14)])
    torch.testing.assert_close(rows, alone, rtol=1e-5, atol=1e-5 * alone.abs().max().item())


def test_the_target_as_its_own_draft_accepts_every_proposal(gguf_files):
    """A quantized draft identical to the target: every proposal verified (the draft's fused steps
    and the target's verify rows agree to the token)."""
    target = gguf_files[0]
    engine = _engine(target, speculative="draft", draft_model=str(target), num_speculative_tokens=4)
    engine.generate(_prompts(2), GREEDY)
    stats = engine.stats()["spec_decode"]
    assert stats["num_draft_tokens"] > 0 and stats["acceptance_rate"] == 1.0, stats


def test_grammar_is_respected_beside_speculated_rows(gguf_files):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer"}},
              "required": ["answer", "n"]}
    from tokenops.engine.sampling.grammar import GrammarSpec

    engine = _engine(gguf_files[0], speculative="ngram", num_speculative_tokens=4)
    matcher = engine.grammar_compiler.compile(GrammarSpec.json_schema(schema))
    free, constrained = engine.generate(
        [[5, 6, 7, 5, 6, 7, 5, 6], _prompts(1)[0]],
        [GREEDY, SamplingParams(temperature=0, max_tokens=40, grammar=matcher)])
    value = json.loads(constrained.outputs[0].text)
    assert value["answer"] in ("yes", "no") and isinstance(value["n"], int)
    assert constrained.outputs[0].finish_reason == "stop"
    assert len(free.outputs[0].token_ids) == GREEDY.max_tokens
    assert engine.stats()["spec_decode"]["num_draft_tokens"] > 0


def test_kv_offload_tier_saves_and_restores_blocks(gguf_files, tmp_path):
    """A, then B (evicts A from the 16-block pool), then A plus a new turn: with the tier A's blocks
    come back from host memory (and disk) instead of being recomputed, and the output is the same."""
    a = [(7 * i) % 200 + 3 for i in range(41)]
    b = [(11 * i) % 200 + 2 for i in range(45)]

    def session(**kw):
        engine = _engine(gguf_files[0], kv_cache_tokens=64, max_num_batched_tokens=32, **kw)
        outs = [engine.generate([p], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
                for p in (a, b, a + [9, 9, 8])]
        return outs, engine

    base, _ = session()
    outs, engine = session(kv_offload_host_blocks=2, kv_offload_disk_blocks=64, kv_offload_disk_path=str(tmp_path))
    assert _tokens(outs) == _tokens(base)
    stats = engine.stats()["kv_offload"]
    assert stats["loaded_blocks"] >= 5 and stats["disk_loaded_blocks"] > 0
    assert base[2].num_cached_tokens < 40 <= outs[2].num_cached_tokens
    engine.scheduler.block_manager.check_invariants([])
