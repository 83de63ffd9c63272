"""Speculative decoding: greedy exactness, the rejection sampler's distribution,
adaptive k, stats and block accounting (tiny random checkpoints, CPU)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.spec.rejection import verify_greedy, verify_proposal
from tokenops.engine.sampling.sampling import SamplingParams

# Repetitive prompts (n-gram hits) and plain ones, of different lengths.
PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7],
    [10, 11, 12, 13] * 6 + [10],
    list(range(20, 60)),
    [1, 2, 3],
    [40, 41, 40, 41, 40, 42, 43, 40, 41],
]


@pytest.fixture(scope="module")
def draft_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama with noise added to every weight: a draft that agrees often, not always."""
    from safetensors.torch import load_file, save_file

    path = tmp_path_factory.mktemp("draft") / "llama_draft"
    shutil.copytree(tiny_llama_dir, path)
    weights = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    noisy = {k: v + 0.05 * torch.randn(v.shape, generator=gen).to(v.dtype) for k, v in weights.items()}
    save_file(noisy, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _config_values(model_dir) -> dict:
    return dict(model=str(model_dir), device="cpu", block_size=4, kv_cache_tokens=512,
                max_num_batched_tokens=16, max_num_seqs=8, torch_threads=1)


def _engine(model_dir, **overrides) -> LLMEngine:
    return LLMEngine(EngineConfig(**{**_config_values(model_dir), **overrides}))


def _greedy(engine, max_tokens=24):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in engine.generate(PROMPTS, params)]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_output_identical_with_batching_and_chunked_prefill(tiny_llama_dir, draft_dir, method):
    base = _greedy(_engine(tiny_llama_dir))
    engine = _engine(tiny_llama_dir, speculative=method, draft_model=str(draft_dir))
    assert _greedy(engine) == base
    stats = engine.stats()["spec_decode"]
    assert stats["num_drafts"] > 0 and stats["num_draft_tokens"] >= stats["num_drafts"]
    assert 0 < stats["num_accepted_tokens"] <= stats["num_draft_tokens"]
    assert sum(stats["accepted_per_position"]) == stats["num_accepted_tokens"]
    assert stats["acceptance_rate"] == pytest.approx(stats["num_accepted_tokens"] / stats["num_draft_tokens"])
    bm = engine.scheduler.block_manager
    assert bm.num_used_blocks == 0
    bm.check_invariants([])


def test_a_draft_without_the_fused_step_keeps_its_weights(tiny_llama_dir, tiny_checkpoint):
    # decode_kernel = "torch": no fused step for the target nor the draft, so the draft's bfloat16
    # default does not apply (the target's own panel_dtype would be an error)
    engine = _engine(tiny_llama_dir, speculative="draft", draft_model=str(tiny_llama_dir), decode_kernel="torch")
    assert engine.spec_decoder.proposer.runner.fused_decode is None
    assert _greedy(engine) == _greedy(_engine(tiny_llama_dir, decode_kernel="torch"))
    assert engine.stats()["spec_decode"]["acceptance_rate"] == 1.0
    # a draft the fused step cannot run (mixture of experts) under "auto": loaded as it is
    engine = _engine(tiny_llama_dir, speculative="draft", draft_model=str(tiny_checkpoint("mixtral")))
    assert engine.spec_decoder.proposer.runner.fused_decode is None
    assert _greedy(engine) == _greedy(_engine(tiny_llama_dir))
    assert engine.stats()["spec_decode"]["num_drafts"] > 0


@pytest.mark.parametrize("draft_panel_dtype", ["float32", "bfloat16"])
def test_identical_draft_accepts_everything_and_keeps_max_k(tiny_llama_dir, draft_panel_dtype):
    # the target as its own draft; with bfloat16 draft weights (the default) the proposals are the
    # rounded model's: the outputs stay the target's, and most proposals are accepted (this random
    # tiny model's logits are close together, so rounding flips more of its argmaxes than a trained
    # model's)
    engine = _engine(tiny_llama_dir, speculative="draft", draft_model=str(tiny_llama_dir), num_speculative_tokens=3,
                     draft_panel_dtype=draft_panel_dtype)
    if draft_panel_dtype == "bfloat16":
        assert engine.spec_decoder.proposer.runner.fused_decode.panel_dtype == "bfloat16"
        base = _greedy(_engine(tiny_llama_dir, max_num_seqs=1), max_tokens=30)[2]
        params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
        assert engine.generate([PROMPTS[2]], params)[0].outputs[0].token_ids == base
        assert engine.stats()["spec_decode"]["acceptance_rate"] >= 0.6
        return
    engine.add_request("r", PROMPTS[2], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    for _ in range(6):
        engine.step()
    seq = engine.scheduler.running[0]
    assert engine.spec_decoder.num_tokens_for(seq) == 3
    while engine.has_unfinished():
        engine.step()
    stats = engine.stats()["spec_decode"]
    assert stats["acceptance_rate"] == 1.0
    assert stats["accepted_per_position"][0] == stats["num_drafts"]


def test_adaptive_k_shrinks_when_proposals_fail(tiny_llama_dir, tiny_checkpoint):
    # an unrelated random model as the draft: its proposals are nearly always rejected
    engine = _engine(tiny_llama_dir, speculative="draft", draft_model=str(tiny_checkpoint("qwen3")),
                     num_speculative_tokens=4)
    engine.add_request("r", PROMPTS[2], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    seen = []
    while engine.has_unfinished():
        running = engine.scheduler.running
        if running and not running[0].is_prefill:
            seen.append(engine.spec_decoder.num_tokens_for(running[0]))
        engine.step()
    assert seen[0] == 4
    assert min(seen) < 4  # shrank after rejections
    stats = engine.stats()["spec_decode"]
    assert stats["num_draft_tokens"] < 4 * stats["num_drafts"]


def test_ngram_proposer_lookup():
    from tokenops.engine.spec.proposers import NgramProposer

    p = NgramProposer(1, 3)
    assert p.find([1, 2, 3, 4, 9, 1, 2, 3], 2) == [4, 9]
    assert p.find([1, 2, 3, 4, 1, 2, 5, 6, 7, 1, 2], 3) == [5, 6, 7]  # latest match wins
    assert p.find([1, 2, 3], 2) == []
    assert p.find([7, 8, 9, 7], 5) == [8, 9, 7]  # runs to the end of the context


def test_rejection_sampler_matches_target_distribution():
    gen = torch.Generator().manual_seed(0)
    vocab, k, num = 6, 2, 12000
    p = torch.softmax(torch.randn(k + 1, vocab, generator=gen) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(k, vocab, generator=gen) * 1.5, dim=-1)
    first = torch.zeros(vocab)
    second_given = torch.zeros(vocab)  # second token when the first proposal was accepted
    num_accepted_first = 0
    for _ in range(num):
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(k)]
        out = verify_proposal(p, drafts, q, gen)
        assert 1 <= len(out) <= k + 1 and out[:-1] == drafts[: len(out) - 1]
        first[out[0]] += 1
        if len(out) > 1:
            num_accepted_first += 1
            second_given[out[1]] += 1
    tv_first = 0.5 * (first / num - p[0]).abs().sum()
    assert tv_first < 0.03, tv_first
    assert 0.5 * (q[0] - p[0]).abs().sum() > 0.15  # the proposal alone would fail the bound
    # given position 1 was accepted, the next token still follows the target's p[1]
    tv_second = 0.5 * (second_given / num_accepted_first - p[1]).abs().sum()
    assert tv_second < 0.05, tv_second
    # expected acceptance of the first proposal: sum_x min(p, q)
    assert num_accepted_first / num == pytest.approx(float(torch.minimum(p[0], q[0]).sum()), abs=0.03)


def test_rejection_sampler_one_hot_proposal():
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    counts = torch.zeros(4)
    for _ in range(6000):
        counts[verify_proposal(p, [1], None, gen)[0]] += 1
    assert 0.5 * (counts / 6000 - p[0]).abs().sum() < 0.03
    assert verify_greedy(torch.tensor([[0.0, 2.0], [3.0, 1.0]]), [1]) == [1, 0]
    assert verify_greedy(torch.tensor([[0.0, 2.0], [3.0, 1.0]]), [0]) == [1]


def _exact_second_token_marginal(runner, prompt, params):
    """P(t2) = sum_t1 p(t1 | prompt) p(t2 | prompt, t1) under the target, with the
    request's temperature/top-k."""
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.sampling.sampling import Sampler

    sampler = Sampler(0)
    table = list(range(runner.num_blocks))[:8]
    logits = runner.execute([ChunkInput(list(prompt), 0, table)])
    p1 = sampler.probs(logits, [params])[0]
    marginal = torch.zeros_like(p1)
    for t1 in torch.nonzero(p1).view(-1).tolist():
        l2 = runner.execute([ChunkInput(list(prompt) + [t1], 0, table)])
        marginal += p1[t1] * sampler.probs(l2, [params])[0]
    return marginal


def test_sampled_outputs_follow_target_distribution_end_to_end(tiny_llama_dir, draft_dir):
    """Many seeded requests with the draft proposer: the second token (the first one
    that goes through rejection sampling) follows the target's exact marginal."""
    prompt = [30, 31, 32, 33, 34]
    params = dict(temperature=1.0, top_k=4, max_tokens=3, ignore_eos=True)
    engine = _engine(tiny_llama_dir, speculative="draft", draft_model=str(draft_dir),
                     num_speculative_tokens=2, max_num_seqs=64, max_num_batched_tokens=512, kv_cache_tokens=4096)
    num = 500
    outs = engine.generate([prompt] * num, [SamplingParams(seed=i, **params) for i in range(num)])
    target = _exact_second_token_marginal(engine.runner, prompt, SamplingParams(**params))
    draft = _exact_second_token_marginal(engine.spec_decoder.proposer.runner, prompt, SamplingParams(**params))
    counts = torch.zeros_like(target)
    for o in outs:
        counts[o.outputs[0].token_ids[1]] += 1
    assert engine.stats()["spec_decode"]["num_drafts"] >= num
    tv = 0.5 * (counts / num - target).abs().sum()
    assert 0.5 * (draft - target).abs().sum() > 0.1, "draft too close to the target for the test to mean anything"
    assert tv < 0.08, tv
    # seeds are respected: the same seeded request gives the same tokens again
    again = engine.generate([prompt] * 3, [SamplingParams(seed=i, **params) for i in range(3)])
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outs[:3]]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_no_block_leaks_with_aborts_and_preemption(tiny_llama_dir, draft_dir, method):
    rng = random.Random(0)
    # a small cache forces preemption while speculative slots are reserved
    engine = _engine(tiny_llama_dir, speculative=method, draft_model=str(draft_dir), kv_cache_tokens=96,
                     enable_prefix_caching=True)
    bm = engine.scheduler.block_manager
    ids = []
    for i in range(10):
        prompt = rng.choice(PROMPTS)[: rng.randint(3, 14)]
        params = SamplingParams(temperature=rng.choice([0, 0.8]), max_tokens=rng.randint(4, 20),
                                ignore_eos=True, seed=i, n=rng.choice([1, 1, 2]))
        engine.add_request(f"r{i}", prompt, params)
        ids.append(f"r{i}")
    num_steps = 0
    while engine.has_unfinished():
        engine.step()
        num_steps += 1
        if num_steps % 3 == 0 and ids:
            engine.abort(ids.pop(rng.randrange(len(ids))))
        live = [s.block_table for s in engine.scheduler.running]
        bm.check_invariants(live)
        assert num_steps < 500
    assert bm.num_used_blocks == 0
    bm.check_invariants([])


def test_config_validation(tiny_llama_dir):
    with pytest.raises(ValueError, match="draft_model"):
        EngineConfig(speculative="draft")
    with pytest.raises(ValueError, match="speculative"):
        EngineConfig(speculative="")
    # any name is a valid config; the engine checks it against its proposers before loading weights
    with pytest.raises(ValueError, match="'medusa' is not a known proposer; available: draft, ngram"):
        _engine(tiny_llama_dir, speculative="medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(speculative="ngram", num_speculative_tokens=0)


class Settings:
    """The ``[plugins.speculative]`` section alone, as :class:`tokenops.config.Settings` hands it out."""

    def __init__(self, conf):
        self.conf = conf

    def plugin_settings(self, name):
        return self.conf if name == "speculative" else {}


def test_plugin_settings_enable_speculation():
    from tokenops_plugins.model_optimization.ngram_proposer import NgramSettings
    plugin = NgramSettings()  # a gateway's own instance

    saved = dict(plugin.conf)
    try:
        plugin.tokenops_configure(Settings({"method": "ngram", "num_tokens": 3, "max_ngram": 2}))
        config = EngineConfig()
        plugin.tokenops_engine_config(config)
        assert (config.speculative, config.num_speculative_tokens) == ("ngram", 3)
        registered = {}
        plugin.tokenops_register_proposers(register=registered.__setitem__)
        assert list(registered) == ["ngram", "suffix"] and registered["ngram"](config).max_ngram == 2
        assert registered["ngram"](config).min_ngram == 2  # ngram's own default below the max set
        explicit = EngineConfig(speculative="draft", draft_model="d")
        plugin.tokenops_engine_config(explicit)  # an explicit engine setting wins
        assert explicit.speculative == "draft"
        with pytest.raises(ValueError, match="method"):
            plugin.tokenops_configure(Settings({"method": 3}))
        with pytest.raises(ValueError, match="num_tokens"):
            plugin.tokenops_configure(Settings({"method": "ngram", "num_tokens": 0}))
        with pytest.raises(ValueError, match="draft_model"):
            plugin.tokenops_configure(Settings({"method": "draft"}))
    finally:
        plugin.conf.clear()
        plugin.conf.update(saved)


def test_async_engine_streams_speculative_tokens(tiny_llama_dir):
    """Through AsyncLLMEngine: deltas of several tokens per step add up to the greedy output."""
    import asyncio

    from tokenops.engine.core.async_engine import AsyncLLMEngine

    prompt = PROMPTS[1]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = _engine(tiny_llama_dir).generate([prompt], params)[0].outputs[0].token_ids
    engine = AsyncLLMEngine(_engine(tiny_llama_dir, speculative="draft", draft_model=str(tiny_llama_dir)))

    async def collect():
        deltas = []
        async for out in engine.generate(prompt, params):
            deltas.append(out.outputs[0].delta_token_ids)
        return deltas

    try:
        deltas = asyncio.run(collect())
    finally:
        engine.shutdown()
    assert [t for d in deltas for t in d] == expected
    assert max(len(d) for d in deltas) > 1  # some steps emitted several tokens
    assert engine.stats()["spec_decode"]["num_accepted_tokens"] > 0


def test_logprobs_and_stop_tokens_match_plain_decoding(tiny_llama_dir):
    """Tokens accepted several per step still get their own logprobs, and a stop token
    in the middle of an accepted run ends the output exactly there."""
    prompt = PROMPTS[2]
    probe = _engine(tiny_llama_dir).generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    stop = probe[0].outputs[0].token_ids[9]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2, stop_token_ids=[stop])
    base = _engine(tiny_llama_dir).generate([prompt], params)[0].outputs[0]
    engine = _engine(tiny_llama_dir, speculative="draft", draft_model=str(tiny_llama_dir))
    spec = engine.generate([prompt], params)[0].outputs[0]
    assert engine.stats()["spec_decode"]["num_accepted_tokens"] > 0
    assert spec.token_ids == base.token_ids and spec.finish_reason == base.finish_reason == "stop"
    assert [e["token_id"] for e in spec.logprobs] == [e["token_id"] for e in base.logprobs]
    for a, b in zip(spec.logprobs, base.logprobs):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)
        assert [t["token_id"] for t in a["top"]] == [t["token_id"] for t in b["top"]]
    assert engine.scheduler.block_manager.num_used_blocks == 0


DEMO = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models"


@pytest.mark.slow
@pytest.mark.skipif(not (DEMO / "draft" / "model.safetensors").exists(), reason="demo models not built")
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_demo_models_greedy_identical(method):
    from tokenops.engine.core.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEMO / "target")
    texts = ["Write a Python function that reverses a string.", "What is the capital of France?",
             "Repeat after me: the quick brown fox jumps over the lazy dog, the quick brown fox."]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}]), add_special_tokens=False)
               for t in texts]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)

    def run(**kw):
        engine = LLMEngine(EngineConfig(model=str(DEMO / "target"), device="cpu", torch_threads=1,
                                        kv_cache_tokens=2048, max_num_batched_tokens=64, **kw))
        return [o.outputs[0].token_ids for o in engine.generate(prompts, params)], engine

    base, _ = run()
    spec, engine = run(speculative=method, draft_model=str(DEMO / "draft"))
    assert spec == base
    assert engine.stats()["spec_decode"]["num_accepted_tokens"] > 0


def test_draft_min_confidence_cuts_proposals_and_stays_exact(tiny_llama_dir, draft_dir):
    from tokenops.plugin_manager import get_plugin

    settings_plugin = get_plugin("ngram_proposer")  # the process's instance: what hook() calls here

    base = _greedy(_engine(tiny_llama_dir))
    saved = settings_plugin.conf["draft_min_confidence"]
    settings_plugin.conf["draft_min_confidence"] = 0.3
    try:  # the plugin's setting reaches the engine the way serve builds one
        from tokenops.policy_hooks import build_engine

        engine = build_engine(EngineConfig(**{**_config_values(tiny_llama_dir), "speculative": "draft",
                                              "draft_model": str(draft_dir)}))
    finally:
        settings_plugin.conf["draft_min_confidence"] = saved
    assert engine.spec_decoder.proposer.min_confidence == 0.3
    assert _greedy(engine) == base
    stats = engine.stats()["spec_decode"]
    unconstrained = _engine(tiny_llama_dir, speculative="draft", draft_model=str(draft_dir))
    _greedy(unconstrained)
    assert stats["num_draft_tokens"] < unconstrained.stats()["spec_decode"]["num_draft_tokens"]


def test_disable_by_batch_size_stops_proposals_in_large_batches_only(tiny_llama_dir, draft_dir):
    base = _greedy(_engine(tiny_llama_dir))
    batched = _engine(tiny_llama_dir, speculative="draft", draft_model=str(draft_dir),
                      speculative_disable_by_batch_size=2)
    assert _greedy(batched) == base  # still exact
    # the prompts run together: proposals only in the steps where fewer than 2 sequences are running
    many = batched.stats()["spec_decode"]["num_drafts"]
    alone = _engine(tiny_llama_dir, speculative="draft", draft_model=str(draft_dir), speculative_disable_by_batch_size=2)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for prompt in PROMPTS:  # one at a time: never 2 running, so it proposes every round
        alone.generate([prompt], params)
    assert alone.stats()["spec_decode"]["num_drafts"] > many
    never = _engine(tiny_llama_dir, speculative="draft", draft_model=str(draft_dir), speculative_disable_by_batch_size=1)
    _greedy(never)
    assert never.stats()["spec_decode"]["num_drafts"] == 0
    with pytest.raises(ValueError, match="speculative_disable_by_batch_size"):
        EngineConfig(speculative_disable_by_batch_size=-1)


def test_plugin_disable_by_batch_size_setting():
    from tokenops_plugins.model_optimization.ngram_proposer import NgramSettings
    plugin = NgramSettings()  # a gateway's own instance

    saved = dict(plugin.conf)
    try:
        plugin.tokenops_configure(Settings({"method": "ngram", "disable_by_batch_size": 4}))
        config = EngineConfig()
        plugin.tokenops_engine_config(config)
        assert config.speculative_disable_by_batch_size == 4
        with pytest.raises(ValueError, match="disable_by_batch_size"):
            plugin.tokenops_configure(Settings({"method": "ngram", "disable_by_batch_size": -2}))
    finally:
        plugin.conf.clear()
        plugin.conf.update(saved)
