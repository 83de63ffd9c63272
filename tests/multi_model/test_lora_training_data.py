"""The shipped adapters' training data (scripts/train_lora_adapters.py): no held-out prompt is ever
trained on, and every training answer passes its suite's own checker (the math answers' two steps
included)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import train_lora_adapters as train
from tokenops_plugins.multi_model._suites import GENERATORS, make_suite


@pytest.mark.parametrize("spec", train.SPECS, ids=lambda s: s.name)
def test_training_pairs_avoid_the_held_out_split_and_pass_the_checker(spec):
    pairs = train.training_pairs(spec.dimension, 64, seed=0)
    assert len(pairs) == 64
    held_out = {t.prompt for t in make_suite(spec.dimension, train.HELDOUT_PER_DIMENSION, seed=0)}
    assert not held_out & {p for p, _ in pairs}
    # rebuild each training task from its prompt's suite to check the answer with the suite's checker
    tasks = {t.prompt: t for s in range(1000, 1010) for t in make_suite(spec.dimension, 256, seed=s)}
    for prompt, answer in pairs[:16]:
        assert tasks[prompt].check(answer), (prompt, answer)


def test_math_answers_write_both_steps():
    task = GENERATORS["math"](__import__("random").Random(3), 0)
    answer = train.math_steps(task.prompt, task.reference)
    assert answer.count("=") == 2 and answer.endswith(task.reference) and task.check(answer)


def test_keep_prompts_come_from_the_other_suites_only():
    prompts = train.keep_prompts("code", 3, seed=0)
    assert len(prompts) == 3 * (len(train.KEEP_DIMENSIONS) - 1)
    assert not {t.prompt for t in make_suite("code", 50, seed=5000)} & set(prompts)


def test_lora_targets_name_only_the_top_layers():
    import re

    spec = train.SPECS[0]
    pattern = re.compile(spec.target_regex(30))
    assert pattern.fullmatch("model.layers.29.self_attn.q_proj")
    assert pattern.fullmatch(f"model.layers.{30 - spec.top_layers}.mlp.down_proj")
    assert not pattern.fullmatch(f"model.layers.{29 - spec.top_layers}.self_attn.q_proj")
