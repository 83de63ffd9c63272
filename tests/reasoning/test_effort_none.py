"""`reasoning_effort: "none"` answers without thinking: the budget (0) closes the block at
once, and the answer still comes (the end of turn is masked until it has begun)."""

from __future__ import annotations

import openai

from tokenops.engine.sampling.thinking import ThinkingControl
from tokenops.testing_serve import ServeProcess

OPEN, CLOSE, EOS, NL, WORD = 1, 2, 3, 4, 5


def test_a_forced_close_masks_the_end_of_turn_until_the_answer_begins():
    control = ThinkingControl(open_ids=(OPEN,), close_ids=(CLOSE,), budget=0, line_end_ids=frozenset({NL}),
                              starts_thinking=True, eos_ids=(EOS,))
    state = control.new_state()
    assert state.forced_token == CLOSE
    state.accept(CLOSE)
    assert state.is_answer_pending  # closed by the budget: an empty answer is not allowed
    state.accept(NL)
    assert state.is_answer_pending  # a line break is not an answer
    state.accept(WORD)
    assert not state.is_answer_pending
    model_closed = ThinkingControl(open_ids=(OPEN,), close_ids=(CLOSE,), starts_thinking=True, eos_ids=(EOS,))
    state = model_closed.new_state()
    state.accept(WORD)
    state.accept(CLOSE)
    assert not state.is_answer_pending  # the model closed it itself: it may end its turn


def test_effort_none_answers_through_serve(tmp_path):
    with ServeProcess(tmp_path) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        r = client.chat.completions.create(model="tokenops-reasoning-small", reasoning_effort="none", max_tokens=32,
                                           messages=[{"role": "user", "content": "What is 17 + 25?"}])
        assert r.choices[0].message.content.strip()  # an answer, not an empty turn
        assert r.usage.completion_tokens_details.reasoning_tokens <= 3  # only the block's tags
        assert not getattr(r.choices[0].message, "reasoning_content", None)
