"""LLMEngine over a fake runner: batching, chunked prefill, preemption, prefix caching,
sampling, stop rules, logprobs, n > 1, aborts, failures, tunables, stats."""

import math

import pytest
import torch

from engine_fakes import EOS, OFFSET, FakeRunner, FakeTokenizer, reference_greedy
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import EngineRequestError, LLMEngine, PromptTooLongError
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.tunables import TunableError

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def make_engine(num_blocks=64, block_size=4, budget=32, max_seqs=8, caching=True, **runner_kw):
    runner = FakeRunner(num_blocks=num_blocks, block_size=block_size, **runner_kw)
    config = EngineConfig(block_size=block_size, kv_cache_tokens=num_blocks * block_size,
                          max_num_batched_tokens=budget, max_num_seqs=max_seqs, enable_prefix_caching=caching)
    return LLMEngine(config, runner=runner)


def prompts(k=5, shared=""):
    tok = FakeTokenizer()
    return [tok.encode(shared + f"prompt number {i} " + "x" * (3 * i)) for i in range(k)]


def assert_no_leak(engine):
    bm = engine.scheduler.block_manager
    assert not engine.has_unfinished()
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("budget,num_blocks", [(512, 256), (7, 256), (16, 22)])
def test_greedy_matches_reference_under_chunking_and_preemption(budget, num_blocks, caching):
    engine = make_engine(num_blocks=num_blocks, budget=budget, caching=caching)
    ps = prompts(5, shared="a shared system prompt. ")
    outs = engine.generate(ps, GREEDY)
    for p, out in zip(ps, outs):
        assert out.finished and out.prompt_token_ids == p
        assert out.outputs[0].token_ids == reference_greedy(p, 8)
        assert out.outputs[0].finish_reason == "length"
        assert out.outputs[0].text == FakeTokenizer().decode(out.outputs[0].token_ids)
    stats = engine.stats()
    if num_blocks == 22:
        assert stats["num_preemptions"] > 0
    if budget == 7:
        assert max(sum(s) for s in engine.runner.chunk_sizes) <= 7
    if caching and budget == 7:  # prompts admitted in one step cannot hit each other
        assert stats["prefix_cache_hits"] > 0
    assert_no_leak(engine)


def test_prefix_cache_hit_computes_fewer_tokens_with_same_output():
    p = prompts(1, shared="the same long preamble " * 4)[0]
    results = {}
    for caching in (True, False):
        engine = make_engine(caching=caching)
        first = engine.generate([p], GREEDY)[0]
        computed_before = engine.runner.num_computed_tokens
        second = engine.generate([p + [OFFSET + 65]], GREEDY)[0]
        results[caching] = (second.outputs[0].token_ids, engine.runner.num_computed_tokens - computed_before,
                            second.num_cached_tokens)
        assert first.num_cached_tokens == 0
    assert results[True][0] == results[False][0]
    assert results[True][2] == (len(p) // 4) * 4 and results[False][2] == 0
    assert results[True][1] == results[False][1] - results[True][2]


def test_tenants_do_not_share_prefix_cache():
    engine = make_engine()
    p = prompts(1, shared="tenant data " * 3)[0]
    engine.add_request("a", p, GREEDY, tenant="alice")
    while engine.has_unfinished():
        engine.step()
    engine.add_request("b", p, GREEDY, tenant="bob")
    engine.add_request("c", p, GREEDY, tenant="alice")
    cached = {}
    while engine.has_unfinished():
        for out in engine.step():
            cached[out.request_id] = out.num_cached_tokens
    assert cached["b"] == 0 and cached["c"] > 0


def test_seeded_sampling_is_reproducible_whatever_the_batch():
    params = SamplingParams(temperature=1.5, top_p=0.95, top_k=50, seed=1234, max_tokens=12)
    alone = make_engine().generate(prompts(1), params)[0].outputs[0].token_ids
    engine = make_engine(budget=9)
    others = [SamplingParams(temperature=1.0, max_tokens=10)] * 3
    mixed = engine.generate(prompts(4)[::-1], others + [params])[3].outputs[0].token_ids
    assert alone == mixed
    assert alone != reference_greedy(prompts(1)[0], 12)  # it did sample
    other_seed = make_engine().generate(prompts(1), SamplingParams(temperature=1.5, seed=99, max_tokens=12))
    assert other_seed[0].outputs[0].token_ids != alone


def spell(text):
    """A "model" that spells ``text`` over and over, whatever the prompt."""
    data = [b + OFFSET for b in text.encode()]
    return lambda context: data[(len(context) - 1) % len(data)]


def test_stop_string_cuts_text_and_is_never_streamed():
    engine = make_engine(next_token=spell("abcdefghij"))
    engine.add_request("r", [0], SamplingParams(temperature=0, max_tokens=50, stop=["zz", "efg"]))
    deltas, final = [], None
    while engine.has_unfinished():
        for out in engine.step():
            deltas.append(out.outputs[0].delta_text)
            final = out
    completion = final.outputs[0]
    assert completion.text == "abcd" and "".join(deltas) == "abcd"
    assert completion.finish_reason == "stop" and completion.stop_reason == "efg"
    assert FakeTokenizer().decode(completion.token_ids) == "abcdefg"  # tokens keep what was generated


def test_eos_stop_token_ids_and_ignore_eos():
    eos_model = lambda context: EOS if len(context) >= 4 else OFFSET + 65  # noqa: E731
    engine = make_engine(next_token=eos_model)
    out = engine.generate([[0, 5]], SamplingParams(temperature=0, max_tokens=10))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason is None and out.token_ids[-1] == EOS
    assert out.text == "AA"
    out = engine.generate([[0, 5]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 10
    out = engine.generate([[0, 5]], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[OFFSET + 65]))[0]
    assert out.outputs[0].stop_reason == OFFSET + 65 and out.outputs[0].text == ""
    assert_no_leak(engine)


def test_logprobs_report_raw_log_softmax_and_top_alternatives():
    engine = make_engine()
    p = prompts(1)[0]
    out = engine.generate([p], SamplingParams(temperature=0, max_tokens=4, logprobs=3))[0].outputs[0]
    assert len(out.logprobs) == 4
    context = list(p)
    for entry, token_id in zip(out.logprobs, out.token_ids):
        assert entry["token_id"] == token_id and len(entry["top"]) == 3
        assert entry["top"][0]["token_id"] == token_id  # greedy picked the best
        assert [t["logprob"] for t in entry["top"]] == sorted([t["logprob"] for t in entry["top"]], reverse=True)
        assert entry["token"] == FakeTokenizer().id_to_token(token_id)
        runner = FakeRunner()
        from tokenops.engine.core.batch import ChunkInput

        logits = runner.execute([ChunkInput(context, 0, list(range(len(context) // 4 + 1)))])[0]
        assert math.isclose(entry["logprob"], torch.log_softmax(logits, -1)[token_id].item(), abs_tol=1e-5)
        context.append(token_id)
    none = engine.generate([p], SamplingParams(temperature=0, max_tokens=2))[0].outputs[0]
    assert none.logprobs is None
    zero = engine.generate([p], SamplingParams(temperature=0, max_tokens=2, logprobs=0))[0].outputs[0]
    assert zero.logprobs[0]["top"] == []


def test_n_completions_share_the_prompt_blocks():
    engine = make_engine(block_size=4)
    p = prompts(1)[0]  # 17 tokens: four full blocks and a partial one
    engine.add_request("r", p, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6))
    engine.step()
    bm = engine.scheduler.block_manager
    tables = [s.block_table for s in engine._requests["r"].seqs]
    assert len(tables) == 3
    assert all(bm.blocks[b].ref_count == 3 for b in tables[0][: len(p) // 4])
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            final = out
    assert [o.index for o in final.outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 6 for o in final.outputs)
    assert len({tuple(o.token_ids) for o in final.outputs}) > 1
    again = make_engine().generate([p], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6))[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in final.outputs]
    greedy = make_engine().generate([p], SamplingParams(n=2, temperature=0, max_tokens=6))[0]
    assert all(o.token_ids == reference_greedy(p, 6) for o in greedy.outputs)
    assert_no_leak(engine)


def test_prompt_too_long_is_rejected_and_long_generations_are_capped():
    engine = make_engine(max_model_len=24)
    assert engine.max_model_len == 24
    with pytest.raises(PromptTooLongError, match="24"):
        engine.add_request("x", list(range(2, 26)), GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("y", [], GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request("z", [100000], GREEDY)
    out = engine.generate([list(range(2, 22))], SamplingParams(temperature=0, max_tokens=100))[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 4


def test_abort_reports_and_frees():
    engine = make_engine()
    engine.add_request("a", prompts(1)[0], SamplingParams(temperature=0, max_tokens=50))
    engine.add_request("b", prompts(2)[1], SamplingParams(temperature=0, max_tokens=3))
    engine.step()
    engine.abort("a")
    engine.abort("unknown")  # no-op
    outs = {o.request_id: o for o in engine.step()}
    assert outs["a"].finished and outs["a"].outputs[0].finish_reason == "abort"
    while engine.has_unfinished():
        engine.step()
    assert_no_leak(engine)


def test_a_failing_request_does_not_take_others_down():
    engine = make_engine()
    bad = [0, 77, 78]
    engine.runner.fail_on_token = 77
    engine.add_request("bad", bad, GREEDY)
    good = prompts(2)
    for i, p in enumerate(good):
        engine.add_request(f"good{i}", p, GREEDY)
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    assert finals["bad"].error and "injected" in finals["bad"].error
    assert finals["bad"].outputs[0].finish_reason == "abort"
    for i, p in enumerate(good):
        assert finals[f"good{i}"].error is None
        assert finals[f"good{i}"].outputs[0].token_ids == reference_greedy(p, 8)
    with pytest.raises(EngineRequestError, match="injected"):
        engine.generate([bad], GREEDY)
    assert_no_leak(engine)


def test_apply_tunables_live_restart_and_unknown():
    engine = make_engine()
    applied = engine.apply_tunables({"engine.max_num_batched_tokens": 64, "max_num_seqs": "4",
                                     "enable_prefix_caching": False, "schedule_policy": "priority"})
    assert applied == {"engine.max_num_batched_tokens": 64, "engine.max_num_seqs": 4,
                       "engine.enable_prefix_caching": False, "engine.schedule_policy": "priority"}
    assert engine.config.max_num_seqs == 4 and engine.config.schedule_policy == "priority"
    with pytest.raises(TunableError, match="restart"):
        engine.apply_tunables({"engine.block_size": 32})
    with pytest.raises(TunableError, match="unknown"):
        engine.apply_tunables({"engine.nope": 1})
    with pytest.raises(TunableError):
        engine.apply_tunables({"max_num_seqs": 0, "max_num_batched_tokens": 128})
    assert engine.config.max_num_batched_tokens == 64  # nothing partially applied
    with pytest.raises(TunableError):
        engine.apply_tunables({"schedule_policy": "random"})


def test_priority_policy_orders_admission():
    engine = make_engine(max_seqs=1)
    engine.apply_tunables({"schedule_policy": "priority"})
    engine.add_request("low", prompts(1)[0], SamplingParams(temperature=0, max_tokens=1), priority=5)
    engine.add_request("high", prompts(1)[0], SamplingParams(temperature=0, max_tokens=1), priority=1)
    order = [o.request_id for _ in range(4) for o in engine.step() if o.finished]
    assert order == ["high", "low"]


def test_stats_have_every_key_and_count():
    engine = make_engine()
    engine.generate(prompts(3), GREEDY)
    stats = engine.stats()
    keys = {"num_running", "num_waiting", "kv_blocks_used", "kv_blocks_total", "kv_cache_usage",
            "prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "last_step_time_s",
            "last_batch_tokens", "total_prompt_tokens", "total_generation_tokens", "num_steps",
            "expert_load", "model"}
    assert keys <= set(stats)
    assert stats["total_generation_tokens"] == 24 and stats["kv_blocks_total"] == 64
    assert stats["total_prompt_tokens"] == sum(map(len, prompts(3)))
    assert stats["model"] == "fake" and stats["num_steps"] >= 8 and stats["kv_cache_usage"] == 0


def test_string_prompts_are_tokenized():
    engine = make_engine()
    out = engine.generate(["hello"], GREEDY)[0]
    assert out.prompt_token_ids == FakeTokenizer().encode("hello")
