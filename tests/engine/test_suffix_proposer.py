"""The ``suffix`` proposer: the suffix array, the corpus walk, the acceptance-table cut, corpus checks,
calibration, and greedy exactness in the engine (tiny checkpoints; the real model is in
``test_suffix_proposer_serve.py``)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.core.policies import BUILTIN_PROPOSERS, EnginePolicies
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.engine.spec.suffix_calibration import calibrate, split_answers
from tokenops.engine.spec.suffix_index import SuffixIndex, suffix_array
from tokenops.engine.spec.suffix_proposer import (
    AMX_VERIFY_COSTS,
    CORPUS_POSITIONS,
    MATCH_BUCKETS,
    OWN_MAX_MATCH,
    OWN_POSITIONS,
    SHARE_BUCKETS,
    AcceptanceTables,
    SuffixProposer,
    best_cut,
    build_suffix_proposer,
    corpus_meta,
    corpus_meta_path,
    default_verify_costs,
    linear_verify_costs,
)


def flat_tables(own: float, corpus: float) -> AcceptanceTables:
    return AcceptanceTables(
        [[own] * OWN_POSITIONS for _ in range(OWN_MAX_MATCH)],
        [[[corpus] * CORPUS_POSITIONS for _ in range(len(MATCH_BUCKETS) + 1)] for _ in range(SHARE_BUCKETS)],
    )


def test_suffix_array_orders_every_suffix():
    rng = random.Random(0)
    for _ in range(200):
        tokens = [rng.randrange(rng.randint(1, 4)) for _ in range(rng.randint(1, 50))]
        expected = sorted(range(len(tokens)), key=lambda i: tokens[i:])  # shorter first on a shared prefix
        assert suffix_array(np.array(tokens)).tolist() == expected


def test_continuation_walks_the_most_frequent_follower():
    # "1 2" is followed by 3 three times and by 4 once; "1 2 3" always by 5, then 6 twice, 7 once
    corpus = [1, 2, 3, 5, 6, 0, 1, 2, 3, 5, 6, 0, 1, 2, 3, 5, 7, 0, 1, 2, 4, 0]
    index = SuffixIndex(np.array(corpus), vocab_size=10)
    walk = index.continuation([9, 1, 2], 4, min_count=1)
    assert walk.match_len == 2  # "9 1 2" is not in the corpus, "1 2" is
    assert walk.tokens[:3] == [3, 5, 6]
    assert walk.probs[:3] == pytest.approx([3 / 4, 1.0, 2 / 3]) and walk.support[:3] == [4, 3, 3]
    assert walk.smoothed(1.0)[0] == pytest.approx(3 / 4 * 4 / 5)
    assert index.continuation([9, 1, 2], 4, min_count=4).tokens == [3]  # the next step has 3 occurrences
    assert index.continuation([8, 8], 4).tokens == []  # no suffix occurs
    with pytest.raises(ValueError, match="token ids"):
        SuffixIndex(np.array([1, 12]), vocab_size=10)


def test_best_cut_stops_where_expected_tokens_per_cost_peak():
    assert best_cut([0.9, 0.9, 0.1], 0.2) == (2, pytest.approx((1 + 0.9 + 0.81) / 1.4))
    assert best_cut([0.1, 0.9], 0.2)[0] == 0  # a first token rarely accepted: plain decoding is cheaper
    assert best_cut([], 0.2) == (0, 1.0)
    assert best_cut([0.5], 0.2)[0] == 1 and best_cut([0.5], 0.2, round_cost=0.3)[0] == 0  # a round's own cost


def test_best_cut_follows_a_measured_cost_table():
    """With a table where more rows cost little more (the AMX tiles), a longer cut pays where a row's
    fixed cost stops it; no cut runs past the table's end."""
    probs = [0.8, 0.3, 0.9, 0.9]
    assert best_cut(probs, 0.25)[0] == 1  # a quarter step a row: the 2nd token (0.24 expected) does not pay
    flat = (1.13, 1.2, 1.25, 1.3)
    length, ratio = best_cut(probs, flat)
    assert length == 4 and ratio == pytest.approx((1 + 0.8 + 0.24 + 0.216 + 0.1944) / 1.3)
    assert best_cut(probs, flat[:2])[0] == 2
    assert best_cut(probs, linear_verify_costs(0.25, 4)) == best_cut(probs, 0.25)
    with pytest.raises(ValueError, match="must not decrease"):
        build_suffix_proposer(EngineConfig(model=None, device="cpu"), "none", verify_costs=[1.2, 1.1])
    with pytest.raises(ValueError, match="numbers >= 1"):
        build_suffix_proposer(EngineConfig(model=None, device="cpu"), "none", verify_costs=[0.5])
    assert build_suffix_proposer(EngineConfig(model=None, device="cpu"), "none", verify_costs=[1.1, 1.2]).verify_costs \
        == (1.1, 1.2)


def test_default_verify_costs_take_the_amx_table_only_where_the_gguf_runs_on_the_tiles(
    tmp_path, tiny_llama_dir, monkeypatch
):
    from tokenops.engine.kernels import quant_kernels
    from tokenops.engine.models.default_model import DEFAULT_MODEL_ENV, smollm2_path

    assert default_verify_costs(EngineConfig(model=str(tiny_llama_dir), device="cpu")) == linear_verify_costs()
    assert default_verify_costs(EngineConfig(model=str(tmp_path / "missing.gguf"), device="cpu")) \
        == linear_verify_costs()
    gguf = smollm2_path()
    if gguf is None:
        pytest.skip("the default model's package is not installed")
    kernels = quant_kernels.get_kernels()
    on = kernels is not None and kernels.amx_active
    for threads in (1, 2, 4):
        expected = AMX_VERIFY_COSTS[min(threads, 2)] if on else linear_verify_costs()
        config = EngineConfig(model=str(gguf), device="cpu", torch_threads=threads)
        assert default_verify_costs(config) == expected
        assert build_suffix_proposer(config, "none").verify_costs == expected
    monkeypatch.delenv(DEFAULT_MODEL_ENV, raising=False)  # model unset: serve's embedded default, the same GGUF
    assert default_verify_costs(EngineConfig(model=None, device="cpu", torch_threads=1)) == \
        (AMX_VERIFY_COSTS[1] if on else linear_verify_costs())
    if on:
        try:
            kernels.set_amx(False)
            assert default_verify_costs(EngineConfig(model=str(gguf), device="cpu")) == linear_verify_costs()
        finally:
            kernels.set_amx(None)


def test_proposer_takes_the_candidate_expected_to_pay_more():
    corpus = np.array([7, 8, 9, 10, 11, 0] * 5)
    index = SuffixIndex(corpus, vocab_size=20)
    sure_corpus = SuffixProposer(index, flat_tables(own=0.3, corpus=0.9))
    # no prompt-lookup match: the corpus continues "7 8" with 9 10 11 0
    assert sure_corpus.find([3, 4, 7, 8], 4) == ([9, 10, 11, 0], "corpus")
    # the sequence repeats itself ("7 8" then 12): prompt lookup proposes 12..., trusted more here
    sure_own = SuffixProposer(index, flat_tables(own=0.9, corpus=0.3))
    assert sure_own.find([7, 8, 12, 13, 7, 8], 2) == ([12, 13], "prompt")
    assert sure_corpus.find([7, 8, 12, 13, 7, 8], 2) == ([9, 10], "corpus")
    unsure = SuffixProposer(index, flat_tables(own=0.1, corpus=0.1))
    assert unsure.find([7, 8, 12, 13, 7, 8], 4) == ([], "prompt")
    lookup_only = SuffixProposer(None, None)
    assert lookup_only.find([7, 8, 12, 13, 7, 8], 2) == ([12, 13], "prompt")
    with pytest.raises(ValueError, match="acceptance tables"):
        SuffixProposer(index, None)


def test_acceptance_tables_round_trip_and_refuse_a_wrong_shape():
    tables = flat_tables(0.5, 0.25)
    assert AcceptanceTables.from_json(json.loads(json.dumps(tables.to_json()))) == tables
    with pytest.raises(ValueError, match="'own'"):
        AcceptanceTables.from_json({"own": [[0.5]], "corpus": tables.corpus})


def test_calibration_learns_that_repeated_phrases_are_accepted():
    rng = random.Random(1)
    phrase = [30, 31, 32, 33, 34, 35]
    answers = []
    for _ in range(24):  # every answer: random tokens, then the phrase, then random tokens, then the stop id
        answers.append(
            [rng.randrange(40, 90) for _ in range(5)] + phrase + [rng.randrange(40, 90) for _ in range(5)] + [2]
        )
    flat = np.array([t for a in answers for t in a])
    assert split_answers(flat, [0, 2]) == answers
    tables = calibrate([[1, 1] for _ in answers], answers, vocab_size=100, folds=4)
    # the phrase's tokens follow a 2+-token match with every occurrence agreeing: near-certain
    assert tables.corpus[SHARE_BUCKETS - 1][1][1] > 0.8
    # a random token after a 1-token match of a random token: rarely right
    assert tables.corpus[5][0][0] < 0.5


def _toy_corpus(tmp_path, model_dir, answers: list[list[int]]):
    from tokenops.engine.models.loader import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    corpus = tmp_path / "answers.u16"
    np.asarray([t for a in answers for t in a], dtype=np.uint16).tofile(corpus)
    tables = calibrate([[1] for _ in answers], answers, tokenizer.vocab_size, folds=4)
    meta = {**corpus_meta(tokenizer), "acceptance": tables.to_json()}
    corpus_meta_path(corpus).write_text(json.dumps(meta))
    return corpus, meta


def test_a_corpus_of_another_tokenizer_or_without_tables_is_refused(tmp_path, tiny_llama_dir):
    corpus, meta = _toy_corpus(tmp_path, tiny_llama_dir, [[5, 6, 7, 2]] * 4)
    config = EngineConfig(model=str(tiny_llama_dir), device="cpu")
    assert build_suffix_proposer(config, str(corpus)).index is not None
    corpus_meta_path(corpus).write_text(json.dumps({**meta, "tokenizer_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="another tokenizer"):
        build_suffix_proposer(config, str(corpus))
    corpus_meta_path(corpus).write_text(json.dumps({k: v for k, v in meta.items() if k != "acceptance"}))
    with pytest.raises(ValueError, match="acceptance"):
        build_suffix_proposer(config, str(corpus))
    with pytest.raises(ValueError, match="needs the token file"):
        build_suffix_proposer(config, str(tmp_path / "missing.u16"))
    assert build_suffix_proposer(config, "none").index is None


def test_the_default_corpus_is_skipped_for_another_tokenizer(tiny_llama_dir, caplog):
    proposer = build_suffix_proposer(EngineConfig(model=str(tiny_llama_dir), device="cpu"))
    assert proposer.index is None  # the shipped corpus is SmolLM2's
    assert "prompt lookup alone" in caplog.text


def test_suffix_speculation_keeps_the_greedy_output(tmp_path, tiny_llama_dir):
    base = LLMEngine(EngineConfig(model=str(tiny_llama_dir), device="cpu", block_size=4, kv_cache_tokens=512))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 5, 6], [20, 21, 22, 23, 24]]
    expected = [o.outputs[0].token_ids for o in base.generate(prompts, params)]
    # the corpus: the model's own answers to half the prompts, 3 copies (every fold of the calibration sees one)
    answers = [list(t) + [2] for t in expected[:2]] * 3
    corpus, _ = _toy_corpus(tmp_path, tiny_llama_dir, answers)
    policies = EnginePolicies(
        proposers={**BUILTIN_PROPOSERS, "suffix": lambda c: build_suffix_proposer(c, str(corpus))}
    )
    config = EngineConfig(
        model=str(tiny_llama_dir),
        device="cpu",
        block_size=4,
        kv_cache_tokens=512,
        speculative="suffix",
        num_speculative_tokens=4,
    )
    spec = LLMEngine(config, policies=policies)
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == expected
    stats = spec.stats()["spec_decode"]
    corpus_stats = stats["proposer"]["corpus"]
    assert corpus_stats["num_drafts"] > 0 and corpus_stats["num_accepted_tokens"] > 0, stats
    assert stats["num_accepted_tokens"] >= corpus_stats["num_accepted_tokens"]


def test_plugin_settings_pick_the_corpus_and_check_it(tmp_path, tiny_llama_dir):
    from tokenops_plugins.model_optimization.ngram_proposer import NgramSettings
    plugin = NgramSettings()  # a gateway's own instance

    class Settings:
        def __init__(self, conf):
            self.conf = conf

        def plugin_settings(self, name):
            return self.conf if name == "speculative" else {}

    corpus, _ = _toy_corpus(tmp_path, tiny_llama_dir, [[5, 6, 7, 2]] * 4)
    saved = dict(plugin.conf)
    try:
        plugin.tokenops_configure(Settings({"method": "suffix", "corpus": str(corpus), "num_tokens": 6}))
        config = EngineConfig(model=str(tiny_llama_dir), device="cpu")
        plugin.tokenops_engine_config(config)
        assert (config.speculative, config.num_speculative_tokens) == ("suffix", 6)
        registered = {}
        plugin.tokenops_register_proposers(register=registered.__setitem__)
        proposer = registered["suffix"](config)
        assert proposer.index is not None and (proposer.lookup.min_ngram, proposer.lookup.max_ngram) == (1, 8)
        assert registered["ngram"](config).min_ngram == 2  # each method keeps its own default sizes
        assert proposer.verify_costs == linear_verify_costs()  # a safetensors toy: no AMX table
        plugin.tokenops_configure(Settings({"method": "suffix", "verify_costs": [1.1, 1.15, 1.2]}))
        assert registered["suffix"](config).verify_costs == (1.1, 1.15, 1.2)
        with pytest.raises(ValueError, match=r"\[plugins.speculative\] verify_costs must not decrease"):
            plugin.tokenops_configure(Settings({"method": "suffix", "verify_costs": [1.3, 1.2]}))
        with pytest.raises(ValueError, match="verify_costs must be a non-empty list"):
            plugin.tokenops_configure(Settings({"method": "suffix", "verify_costs": "fast"}))
        with pytest.raises(ValueError, match="corpus"):
            plugin.tokenops_configure(Settings({"method": "suffix", "corpus": 3}))
        plugin.tokenops_configure(Settings({"method": "suffix", "corpus": str(tmp_path / "none.u16")}))
        with pytest.raises(ValueError, match="needs the token file"):
            registered["suffix"](config)
    finally:
        plugin.conf.clear()
        plugin.conf.update(saved)


def test_a_match_hint_gives_the_same_walks_as_a_fresh_search():
    """Continuing a growing context from the last call's hint gives exactly the fresh search's
    continuation (tokens, shares, supports, match length) at every step, through matches that extend,
    matches that break, no match at all and the length cap."""
    rng = random.Random(7)
    corpus = []
    phrases = [[rng.randrange(2, 30) for _ in range(rng.randrange(3, 12))] for _ in range(40)]
    for _ in range(300):
        corpus += rng.choice(phrases) + ([rng.randrange(2, 30)] if rng.random() < 0.3 else []) + [0]
    index = SuffixIndex(np.array(corpus), vocab_size=40)
    for trial in range(30):
        context = [rng.randrange(2, 40) for _ in range(3)]
        hint = None
        for _ in range(60):
            grow = rng.choice(phrases)[: rng.randrange(1, 4)] if rng.random() < 0.7 else [rng.randrange(2, 40)]
            context = context + grow
            for max_match in (16, 4):
                fresh = index.continuation(context, 5, max_match=max_match, min_count=1)
                if max_match == 16:
                    hinted = index.continuation(context, 5, max_match=16, min_count=1, hint=hint)
                    assert (hinted.tokens, hinted.probs, hinted.support, hinted.match_len) == \
                        (fresh.tokens, fresh.probs, fresh.support, fresh.match_len), (trial, context)
                    hint = hinted.hint
    # the proposer keeps one hint per sequence: the same proposals as without
    proposer = SuffixProposer(index, flat_tables(own=0.5, corpus=0.8))
    context = [5, 6]
    for step in range(80):
        context += rng.choice(phrases)[: rng.randrange(1, 3)]
        assert proposer.find(context, 6, seq_id=3) == proposer.find(context, 6), step
    assert 3 in proposer._hints
    proposer.retain(set())
    assert not proposer._hints
    # a hint from another context (its last token differs) or another min_count is ignored
    walk = index.continuation(phrases[0], 3, min_count=1)
    other = [*phrases[1], 39]
    assert index.continuation(other, 3, min_count=1, hint=walk.hint) == index.continuation(other, 3, min_count=1)
