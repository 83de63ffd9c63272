"""Budget forcing and reflection masks in the engine core (fake runner, byte tokens)."""

import pytest

from engine_fakes import EOS, OFFSET, FakeRunner, FakeTokenizer
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.engine.sampling.thinking import ThinkingControl

TOK = FakeTokenizer()
THOUGHT = "abcWdefghijklmnopqrstuvwxyz\n"  # 28 characters of natural thinking, a reflection "W" inside


def scripted(context: list[int]) -> int:
    """Opens <t>, thinks THOUGHT, closes </t>, answers 42, ends."""
    text = TOK.decode(context)
    after = text.split("Q:", 1)[1]
    if "</t>" in after:
        answer = after.split("</t>", 1)[1]
        return EOS if answer == "\n42" else ord("\n42"[len(answer)]) + OFFSET
    if "<t>" not in after:
        return ord("<t>"[len(after)]) + OFFSET
    thought = after.split("<t>", 1)[1]
    script = THOUGHT + "</t>"
    return ord(script[len(thought)]) + OFFSET if len(thought) < len(script) else ord("z") + OFFSET


def run(control, max_tokens=80):
    runner = FakeRunner(next_token=scripted)
    engine = LLMEngine(EngineConfig(block_size=4, kv_cache_tokens=1024, max_num_batched_tokens=64), runner=runner)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, thinking=control)
    return engine.generate([TOK.encode("Q:")], params)[0].outputs[0]


def control(budget=None, suppress=()):
    ids = lambda s: tuple(TOK.encode(s, add_special_tokens=False))  # noqa: E731
    return ThinkingControl(open_ids=ids("<t>"), close_ids=ids("</t>"), budget=budget,
                           suppress_ids=tuple(i for w in suppress for i in ids(w)), newline_ids=ids("\n"),
                           line_end_ids=frozenset(ids("\n")))


def test_unlimited_counts_the_block_and_changes_nothing():
    out = run(control())
    assert out.text == "<t>" + THOUGHT + "</t>\n42"
    assert out.num_reasoning_tokens == len("<t>" + THOUGHT + "</t>")


@pytest.mark.parametrize("budget", [0, 1, 5, 12])
def test_budget_forces_the_close_and_the_model_answers(budget):
    out = run(control(budget))
    thought = out.text.split("<t>", 1)[1].split("</t>", 1)[0]
    assert out.text.endswith("</t>\n42") and out.finish_reason == "stop"
    # the budget's tokens, then a forced line break (the last one did not end a line) and the close
    assert thought == THOUGHT[:budget] + "\n"  # budget 0 gives "<t>\n</t>", as Qwen3 writes an empty block
    assert out.num_reasoning_tokens <= len("<t>") + budget + 1 + len("</t>")


def test_reflection_tokens_are_masked_only_while_thinking():
    out = run(control(suppress=("W",)))
    thought = out.text.split("<t>", 1)[1].split("</t>", 1)[0]
    assert "W" not in thought and thought.startswith("abc")


def test_no_thinking_control_leaves_sequences_alone():
    out = run(None)
    assert out.text == "<t>" + THOUGHT + "</t>\n42" and out.num_reasoning_tokens == 0
