"""Issue 20's answer half, through a real ``tokenops serve`` on real model output: a fact
stated early in a conversation that has outgrown the model's context is answered correctly
with session memory, while the plain conversation is refused (``context_length_exceeded``)
and a client that truncates its history itself cannot answer.

The model is the bundled ladder-large (it reads a number out of its prompt: held-out
retrieval in ``tokenops/demo_models/ladder_report.json``), its context cut to 512 tokens;
the conversations are those of ``tests/benchmarks/session_memory.py`` with the vault code
alone (``--distractors 0``) among ~50 filler turns (~1,550 tokens). With two distractor codes
stated next to it this small model often answers a distractor (30% correct, see
docs/engine-optimizations.md#session-memory): retrieval is memory's part, telling keys apart
the model's."""

from __future__ import annotations

import random
from pathlib import Path

import openai
import pytest

from tests.benchmarks.session_memory import conversation
from tokenops.testing_serve import ServeProcess

LARGE = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "ladder-large"

CONFIG = f"""
[[models]]
name = "ladder-large"
path = "{LARGE}"
engine = {{ max_model_len = 512 }}

[gateway]
api_keys = {{ "key-a" = "tenant-a" }}

[plugins.session_memory]
enabled = true
embedder = "lexical"
"""


def truncated(messages: list[dict], keep_turns: int = 12) -> list[dict]:
    """What a client does without memory: the system prompt, the newest turns, the question."""
    return messages[:1] + messages[-(2 * keep_turns + 1):]


@pytest.mark.parametrize("seed", [0])
def test_memory_answers_a_fact_that_truncation_loses(tmp_path, seed):
    rng = random.Random(seed)
    conversations = [conversation(rng, 50, distractors=0) for _ in range(4)]
    with ServeProcess(tmp_path, config=CONFIG) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="key-a", max_retries=0, timeout=60)
        correct_memory = correct_truncated = 0
        for i, (messages, code) in enumerate(conversations):
            with pytest.raises(openai.BadRequestError) as err:  # too long for the model: the usual 400
                client.chat.completions.create(model="ladder-large", messages=messages, max_tokens=8)
            assert err.value.code == "context_length_exceeded"
            out = client.chat.completions.create(model="ladder-large", messages=messages, max_tokens=8, temperature=0,
                                                 extra_headers={"x-session-id": f"s{i}"})
            correct_memory += code in out.choices[0].message.content
            assert out.usage.prompt_tokens <= 512 - 8
            short = truncated(messages)
            assert not any(code in m["content"] for m in short)  # the fact is gone
            out = client.chat.completions.create(model="ladder-large", messages=short, max_tokens=8, temperature=0)
            correct_truncated += code in out.choices[0].message.content
        assert correct_truncated == 0
        assert correct_memory >= 3, f"memory answered {correct_memory} of {len(conversations)}"
