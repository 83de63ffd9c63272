"""Workloads: synthetic length distributions, ShareGPT, shared prefix, replay from a store."""

import datetime as dt

import numpy as np
import pytest

from tokenops.bench.synthetic import lengths
from tokenops.bench.workloads import WorkloadError, build_workload, get_workloads


def test_builtin_workloads_are_registered_through_the_hook():
    assert {"synthetic", "shared-prefix", "sharegpt", "sharegpt-multiturn", "replay"} <= set(get_workloads())
    with pytest.raises(WorkloadError, match="unknown workload"):
        build_workload("nope", 3)


@pytest.mark.parametrize("dist", ["uniform", "normal", "lognormal"])
def test_length_distributions_have_the_asked_mean(dist):
    vals = np.array(lengths(5000, 200, dist, 0.3, np.random.default_rng(0)))
    assert vals.mean() == pytest.approx(200, rel=0.03)
    assert vals.std() / 200 == pytest.approx(0.3 if dist != "uniform" else 0.3 / np.sqrt(3), rel=0.1)
    assert vals.min() >= 1


def test_synthetic_fixed_lengths_and_seed():
    a = build_workload("synthetic", 5, seed=3, input_len=50, output_len=7)
    assert all(len(r.messages[0]["content"].split()) == 50 and r.max_tokens == 7 for r in a)
    b = build_workload("synthetic", 5, seed=3, input_len=50, output_len=7)
    assert [r.messages for r in a] == [r.messages for r in b]


def test_shared_prefix_reuses_system_prompts():
    reqs = build_workload("shared-prefix", 40, seed=1, prefix_len=30, num_prefixes=3, input_len=5)
    systems = {r.messages[0]["content"] for r in reqs}
    assert len(systems) == 3
    assert all(r.messages[0]["role"] == "system" and len(r.messages[1]["content"].split()) == 5 for r in reqs)
    assert all(r.num_prompt_tokens == 35 for r in reqs)


def test_sharegpt_first_turns_respect_limits():
    reqs = build_workload("sharegpt", 20, seed=0, max_input_len=200, max_output_len=64)
    assert len(reqs) == 20
    assert all(r.num_prompt_tokens <= 200 and 4 <= r.max_tokens <= 64 and not r.followups for r in reqs)
    assert len({r.messages[0]["content"] for r in reqs}) > 10  # real, varied conversations
    other = build_workload("sharegpt", 20, seed=1, max_input_len=200, max_output_len=64)
    assert [r.messages for r in other] != [r.messages for r in reqs]


def test_sharegpt_multiturn_keeps_conversations():
    reqs = build_workload("sharegpt-multiturn", 5, seed=0, max_turns=3)
    assert all(2 <= r.num_turns <= 3 and len(r.followup_max_tokens) == len(r.followups) for r in reqs)


def test_replay_from_a_seeded_store(tmp_path):
    from tokenops.store import Store
    from tokenops.store.table_models import RequestRow

    path = str(tmp_path / "s.duckdb")
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0)
    with Store.open(path) as store:
        store.add(*[RequestRow(id=f"r{i}", ts=t0 + dt.timedelta(seconds=2 * i), tokens_in=10 + i, tokens_out=3 + i,
                               status="ok") for i in range(4)],
                  RequestRow(id="bad", ts=t0 + dt.timedelta(seconds=1), tokens_in=5, tokens_out=0, status="error"))
    reqs = build_workload("replay", 10, store=path, time_scale=0.5)
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 2.0, 3.0]
    assert [r.max_tokens for r in reqs] == [3, 4, 5, 6]
    assert [len(r.messages[0]["content"].split()) for r in reqs] == [10, 11, 12, 13]
    assert len(build_workload("replay", 2, store=path)) == 2
    with pytest.raises(WorkloadError, match="does not exist"):
        build_workload("replay", 2, store=str(tmp_path / "missing.duckdb"))


def test_file_workload_reads_prompts_messages_and_lengths_in_order(tmp_path):
    path = tmp_path / "reqs.jsonl"
    path.write_text(
        '{"prompt": "one two three", "output_tokens": 5, "prompt_tokens_count": 3}\n'
        "\n"
        '{"prompt": "hi", "system": "be brief", "output_tokens_count": 7}\n'
        '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "max_tokens": 2}\n'
        '{"prompt": "no length given"}\n')
    reqs = build_workload("file", 6, dataset=str(path), output_len=9)
    assert [r.max_tokens for r in reqs] == [5, 7, 2, 9, 5, 7]  # file order, repeated
    assert reqs[0].messages == [{"role": "user", "content": "one two three"}] and reqs[0].num_prompt_tokens == 3
    assert reqs[1].messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert reqs[2].messages[0] == {"role": "system", "content": "s"} and reqs[2].num_prompt_tokens is None
    assert reqs[4] is not reqs[0] and reqs[4].messages == reqs[0].messages
    # a JSON array works too
    arr = tmp_path / "reqs.json"
    arr.write_text('[{"prompt": "a", "output_tokens": 3}, {"prompt": "b", "output_tokens": 4}]')
    assert [r.max_tokens for r in build_workload("file", 2, dataset=str(arr))] == [3, 4]


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a", "output_tokens": 3}\n{"prompt": "b", "output_tokens": }\n', r"reqs.jsonl:2: not valid JSON"),
    ('{"output_tokens": 3}\n', r"reqs.jsonl:1: a record needs a non-empty \"prompt\""),
    ('{"prompt": "a", "output_tokens": -1}\n', r"reqs.jsonl:1: output_tokens must be a positive integer"),
    ('{"prompt": "a", "output_tokens": "ten"}\n', r"output_tokens must be a positive integer"),
    ('{"messages": [{"role": "wizard", "content": "x"}], "output_tokens": 3}\n', r"each message needs a role"),
    ('["just a string"]', r"reqs.jsonl:1: each record must be a JSON object"),
    ('{"prompt": "a"}\n', r"no answer length"),
    ("\n\n", r"has no records"),
])
def test_file_workload_bad_input_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "reqs.jsonl"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=message):
        build_workload("file", 2, dataset=str(path))


def test_file_workload_needs_an_existing_dataset(tmp_path):
    with pytest.raises(WorkloadError, match="needs --dataset"):
        build_workload("file", 2)
    with pytest.raises(WorkloadError, match="does not exist"):
        build_workload("file", 2, dataset=str(tmp_path / "missing.jsonl"))
