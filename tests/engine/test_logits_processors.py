"""Penalties, ``logit_bias``, ``min_tokens`` and prompt logprobs: the batched transforms against
transformers' logits processors, and greedy decoding through the engine against a step-by-step
Hugging Face reference on a tiny random Llama (with speculative decoding on, too)."""

from __future__ import annotations

import pytest
import torch

from tiny_models import load_hf_model
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.sampling.logits_processors import apply_processors
from tokenops.engine.sampling.sampling import Sampler, SamplingParams
from tokenops.engine.core.sequence import Sequence

VOCAB = 32
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [10, 11, 12, 13] * 4 + [10], list(range(20, 45)), [1, 2, 3]]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _seq(prompt: list[int], output: list[int], **params) -> Sequence:
    s = Sequence("r", prompt, SamplingParams(**params))
    s.token_ids += output
    return s


def test_repetition_penalty_equals_transformers_processor():
    from transformers import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, VOCAB, generator=g) * 3
    rows = [([1, 2, 3], [4, 4, 9]), ([7], []), ([0, 31], [31, 5])]
    seqs = [_seq(p, o, repetition_penalty=r) for (p, o), r in zip(rows, (1.3, 0.7, 2.0))]
    got = apply_processors(logits, seqs, eos_token_ids=())
    for i, ((p, o), r) in enumerate(zip(rows, (1.3, 0.7, 2.0))):
        want = RepetitionPenaltyLogitsProcessor(r)(torch.tensor([p + o]), logits[i:i + 1].clone())
        torch.testing.assert_close(got[i], want[0])


def test_logit_bias_and_min_tokens_equal_transformers_processors():
    from transformers import MinNewTokensLengthLogitsProcessor, SequenceBiasLogitsProcessor

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, VOCAB, generator=g)
    bias = {3: 5.0, 17: -100.0}
    seqs = [_seq([1, 2], [4], logit_bias=bias, max_tokens=8), _seq([1, 2], [4], min_tokens=3, max_tokens=8)]
    got = apply_processors(logits, seqs, eos_token_ids=(9,))
    hf_bias = SequenceBiasLogitsProcessor({(t,): v for t, v in bias.items()})(torch.tensor([[1, 2, 4]]), logits[:1].clone())
    torch.testing.assert_close(got[0], hf_bias[0])
    hf_min = MinNewTokensLengthLogitsProcessor(2, 3, 9)(torch.tensor([[1, 2, 4]]), logits[1:].clone())
    torch.testing.assert_close(got[1], hf_min[0])
    done = _seq([1, 2], [4, 5, 6], min_tokens=3, max_tokens=8)  # three generated: EOS is allowed again
    torch.testing.assert_close(apply_processors(logits[1:], [done], eos_token_ids=(9,)), logits[1:])


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    logits = torch.zeros(2, VOCAB)
    seqs = [_seq([4, 4, 4], [4, 5, 5], presence_penalty=0.5, frequency_penalty=1.0), _seq([4], [4])]
    got = apply_processors(logits, seqs, eos_token_ids=())
    assert got[0, 4].item() == pytest.approx(-1.5) and got[0, 5].item() == pytest.approx(-2.5)
    assert got[0, 6].item() == 0.0 and torch.equal(got[1], logits[1])  # the second row asked for nothing


def test_a_masked_token_stays_masked_and_an_impossible_row_keeps_its_logits():
    logits = torch.full((1, VOCAB), float("-inf"))
    logits[0, 9] = 0.0  # a grammar that allows only end-of-sequence
    seq = _seq([1], [], min_tokens=2, max_tokens=4, repetition_penalty=1.5, logit_bias={3: 100})
    got = apply_processors(logits, [seq], eos_token_ids=(9,))
    assert got[0, 9].item() == 0.0 and got[0, 3].item() == float("-inf")


@pytest.mark.parametrize("kwargs,match", [
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"logit_bias": {1: 101}}, "logit_bias"),
    ({"logit_bias": {-1: 1}}, "logit_bias"), ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"max_tokens": 0}, "max_tokens"), ({"prompt_logprobs": 21}, "prompt_logprobs"),
])
def test_invalid_values_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_logprobs_are_the_unpenalised_distribution():
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    seq = Sequence("r", [1], SamplingParams(temperature=0, logprobs=1, logit_bias={1: -50.0}))
    out = Sampler().sample(logits, [seq])[0]
    assert out.token_id == 2  # the bias moved the choice
    assert out.logprob == pytest.approx(torch.log_softmax(logits[0], -1)[2].item())


# -- greedy through the engine ------------------------------------------------------------------


def _reference(hf, prompt: list[int], params: SamplingParams, eos: int) -> list[int]:
    """Greedy decoding with the full forward each step and the transforms written out per token."""
    ids = list(prompt)
    out: list[int] = []
    for _ in range(params.max_tokens):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].float().clone()
        for t, v in (params.logit_bias or {}).items():
            logits[t] += v
        if len(out) < params.min_tokens:
            logits[eos] = float("-inf")
        for t in set(out):
            logits[t] -= params.presence_penalty + params.frequency_penalty * out.count(t)
        if params.repetition_penalty != 1.0:
            for t in set(ids):
                logits[t] = logits[t] / params.repetition_penalty if logits[t] > 0 else logits[t] * params.repetition_penalty
        token = int(logits.argmax())
        out.append(token)
        ids.append(token)
        if token == eos and len(out) > params.min_tokens:
            break
    return out


PARAMS = [
    dict(repetition_penalty=1.8), dict(frequency_penalty=1.5, presence_penalty=0.5),
    dict(logit_bias={12: 4.0, 30: -100.0}), dict(min_tokens=6, repetition_penalty=1.2),
]


@pytest.mark.parametrize("speculative", [None, "draft"])
def test_engine_greedy_with_penalties_equals_the_reference(tiny_llama_dir, speculative):
    hf = load_hf_model(tiny_llama_dir)
    eos = hf.config.eos_token_id
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), device="cpu", torch_threads=1, block_size=4,
                                    kv_cache_tokens=512, max_num_batched_tokens=16, max_num_seqs=8,
                                    speculative=speculative, draft_model=str(tiny_llama_dir) if speculative else None))
    # every prompt with every transform, batched together (and one row with none beside them)
    cases = [(p, SamplingParams(temperature=0, max_tokens=10, **kw)) for kw in PARAMS for p in PROMPTS[:2]]
    cases.append(([10, 11, 12, 13] * 6 + [10], SamplingParams(temperature=0, max_tokens=10)))
    outs = engine.generate([p for p, _ in cases], [sp for _, sp in cases])
    for (prompt, sp), out in zip(cases, outs):
        assert out.outputs[0].token_ids == _reference(hf, prompt, sp, eos), (prompt, sp)
    if speculative:  # the plain row still speculated (the draft, the model itself, ignores penalties)
        assert engine.stats()["spec_decode"]["num_drafts"] > 0


@pytest.mark.parametrize("decode_kernel", ["auto", "torch"])  # the fused native step and the PyTorch forward
def test_prompt_logprobs_equal_the_model_and_max_tokens_zero_scores_only(tiny_llama_dir, decode_kernel):
    hf = load_hf_model(tiny_llama_dir)
    # a small token budget: the long prompt is computed in several chunks; caching is on
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), device="cpu", torch_threads=1, block_size=4,
                                    kv_cache_tokens=512, max_num_batched_tokens=8, decode_kernel=decode_kernel))
    engine.generate([PROMPTS[2]], SamplingParams(temperature=0, max_tokens=2))  # its blocks are cached now
    scored, generated = engine.generate(
        [PROMPTS[2], PROMPTS[0]],
        [SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=2),
         SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=0, logprobs=0)])
    assert scored.outputs[0].token_ids == [] and scored.outputs[0].finish_reason == "length"
    assert len(generated.outputs[0].token_ids) == 3
    if decode_kernel == "auto":
        assert engine.runner.num_fused_steps > 0
    for out, prompt, k in ((scored, PROMPTS[2], 2), (generated, PROMPTS[0], 0)):
        entries = out.prompt_logprobs
        assert entries is not None and len(entries) == len(prompt) and entries[0] is None
        with torch.no_grad():
            want = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
        for i, e in enumerate(entries[1:], start=1):
            assert e["token_id"] == prompt[i]
            assert e["logprob"] == pytest.approx(want[i - 1, prompt[i]].item(), abs=1e-4)
            assert [t["token_id"] for t in e["top"]] == want[i - 1].topk(k).indices.tolist()[:k]
