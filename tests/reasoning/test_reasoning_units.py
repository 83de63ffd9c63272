"""Units of the reasoning parts: the streamed splitter, budget fields, the policy plugin,
the adaptive table and the reflection-token lookup."""

import random

import pytest
from tokenops.backends.reasoning_control import decide_budget, reflection_token_ids, requested_budget_fields
from tokenops.backends.reasoning_parsers import ReasoningSplitter, get_reasoning_parser, split_reasoning
from tokenops.plugin_manager import get_plugin_manager
from tokenops.types import BackendError, GatewayRequest, OutputFields, ReasoningBudget
from tokenops_plugins.model_optimization._adaptive_budget import BudgetTable, features, learn
from tokenops_plugins.model_optimization._reasoning_tasks import make_reasoning_suite
from tokenops_plugins.model_optimization.reasoning_budget import ReasoningBudgetPolicy

THINK = get_reasoning_parser("think")


@pytest.mark.parametrize("seed", range(20))
def test_splitter_gives_the_same_split_however_the_text_is_cut(seed):
    text = "<think>\n1+2+3\n=3+3\n=6\n</think>\n6"
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 8)))
    splitter, reasoning, content = ReasoningSplitter(THINK), "", ""
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        r, c = splitter.push(text[a:b])
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    assert (reasoning + r, content + c) == ("1+2+3\n=3+3\n=6", "6")


def test_split_without_a_block_and_with_an_open_one():
    assert split_reasoning("just an answer", THINK) == (None, "just an answer")
    assert split_reasoning("<think>\ncut off by max_tokens", THINK) == ("cut off by max_tokens", "")
    assert split_reasoning("thought\n</think>\nanswer", THINK, starts_thinking=True) == ("thought", "answer")
    with pytest.raises(ValueError, match="unknown reasoning_parser"):
        get_reasoning_parser("nope")


def chat(**body):
    return GatewayRequest(kind="chat", model="m", body={"messages": [], **body}, messages=[])


@pytest.mark.parametrize("body,message", [({"reasoning_effort": "huge"}, "reasoning_effort must be"),
                                          ({"max_thinking_tokens": -2}, "max_thinking_tokens must be"),
                                          ({"max_thinking_tokens": True}, "max_thinking_tokens must be")])
def test_bad_budget_fields_are_400s(body, message):
    with pytest.raises(BackendError, match=message) as e:
        decide_budget(chat(**body), "m", True, "m#0")
    assert e.value.status == 400


def test_budget_fields_on_a_model_without_parser_are_400s():
    with pytest.raises(BackendError, match="reasoning_parser") as e:
        decide_budget(chat(reasoning_effort="low"), "m", False, "m#0")
    assert e.value.status == 400
    assert decide_budget(chat(), "m", False, "m#0") is None
    assert requested_budget_fields(OutputFields(max_thinking_tokens=0)) == {"max_thinking_tokens": 0}


def test_policy_precedence_and_tunables():
    get_plugin_manager()  # the loaded plugins declare their decision keys (reasoning_features)
    policy = ReasoningBudgetPolicy()  # one gateway's instance
    policy.reset()
    try:
        assert policy.tokenops_reasoning_budget(chat(), "m") is None  # off by default: unlimited, no mask
        assert policy.tokenops_reasoning_budget(chat(reasoning_effort="low"), "m").max_thinking_tokens == 16
        assert policy.tokenops_reasoning_budget(chat(reasoning_effort="high"), "m").max_thinking_tokens is None
        assert policy.tokenops_reasoning_budget(chat(reasoning_effort="minimal"), "m").max_thinking_tokens == 0
        both = chat(reasoning_effort="low", max_thinking_tokens=3)
        assert policy.tokenops_reasoning_budget(both, "m").max_thinking_tokens == 3
        policy.tokenops_apply_tunables({"reasoning.budget_low": 7, "reasoning.suppress_reflection": True})
        got = policy.tokenops_reasoning_budget(chat(reasoning_effort="low"), "m")
        assert got == ReasoningBudget(7, ("Wait", "Hmm"), "reasoning_effort=low")
        assert policy.tokenops_reasoning_budget(chat(), "m").suppress == ("Wait", "Hmm")
        with pytest.raises(ValueError):
            policy.configure(low=-5)
    finally:
        policy.reset()


def test_adaptive_table_learns_the_smallest_budget_that_keeps_accuracy(tmp_path):
    short = make_reasoning_suite("multistep", 40, seed=3, terms=(2, 2))
    long = make_reasoning_suite("multistep", 40, seed=3, terms=(6, 6))
    # short items are right from budget 8 on, long ones need 32
    results = [(t.prompt, {None: True, 0: False, 8: True, 32: True}, 20) for t in short]
    results += [(t.prompt, {None: True, 0: False, 8: False, 32: True}, 60) for t in long]
    table = learn(results)
    dim, short_words = features(short[0].prompt)
    assert table.budgets[dim][short_words] == 8 and table.budget_for(short[0].prompt)[0] == 8
    assert table.budget_for(long[0].prompt)[0] == 32
    # a tolerance of half the items lets one group drop to the budget that saves most per item lost
    relaxed = learn(results, tolerance=0.5)
    assert relaxed.budget_for(long[0].prompt)[0] == 0 and relaxed.budget_for(short[0].prompt)[0] == 8
    path = tmp_path / "t.json"
    path.write_text(__import__("json").dumps(table.to_json()))
    assert BudgetTable.from_json(table.to_json()).budgets == table.budgets
    policy = ReasoningBudgetPolicy()
    policy.reset()
    try:
        policy.configure(adaptive=True, adaptive_table=str(path))
        got = policy.tokenops_reasoning_budget(GatewayRequest(kind="chat", model="m", body={},
                                                              messages=[{"role": "user", "content": long[1].prompt}]), "m")
        assert got.max_thinking_tokens == 32 and got.reason.startswith("adaptive")
    finally:
        policy.reset()


def test_reflection_tokens_are_found_in_the_vocabulary():
    class Tok:
        vocab = ["a", "Wait", " Wait", "Waiting", "Hmm,", "x"]
        vocab_size = len(vocab)

        def token_text(self, i):
            return self.vocab[i]

    assert reflection_token_ids(Tok(), ("Wait", "Hmm")) == (1, 2, 4)


def test_the_shipped_reasoning_model_is_complete_and_served_by_default():
    import json
    from pathlib import Path

    from tokenops.backends.registry import DEMO_REASONING_NAME, default_model_configs

    folder = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "reasoning-small"
    if not (folder / "config.json").is_file():
        pytest.skip("reasoning-small not trained")
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    assert (folder / "model.safetensors").stat().st_size < 8 << 20
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert [len(tok.encode(t, add_special_tokens=False).ids) for t in ("<think>", "</think>", "Wait")] == [1, 1, 1]
    entry = next(m for m in default_model_configs() if m.name == DEMO_REASONING_NAME)
    assert entry.reasoning_parser == "think" and Path(entry.path) == folder
