"""The shipped adapters' training data (scripts/train_lora_adapters.py): no held-out prompt is ever
trained on, and every training answer passes its suite's own checker (the math answers' two steps
included)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

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


@pytest.mark.parametrize("op", ["+", "-", "*"])
def test_math_answers_write_digit_steps_that_end_on_the_reference(op):
    import random

    rng, seen = random.Random(3), 0
    for i in range(400):
        task = GENERATORS["math"](rng, i)
        if f" {op} " not in task.prompt:
            continue
        answer = train.math_steps(task.prompt, task.reference)
        assert answer.count("=") >= 2 and answer.endswith(task.reference) and task.check(answer), answer
        seen += 1
    assert seen > 50


def test_math_column_form_names_the_carry():
    answer = train.math_steps("Compute (36 + 78) + 7. Reply with the number only.", "121")
    assert answer == "36+78+07: units 6+8=14, 14+7=21, tens 3+7=10, 10+0=10, 10+2=12, answer 121"
    minus = train.math_steps("Compute (36 - 78) + 7. Reply with the number only.", "-35")
    assert minus.startswith("36-78+07: units 6-8=-2, -2+7=5,") and minus.endswith("-40+5=-35")


def test_keep_prompts_come_from_the_other_suites_only():
    prompts = train.keep_prompts("code", 3, seed=0)
    assert len(prompts) == 3 * (len(train.KEEP_DIMENSIONS) - 1)
    assert "code" not in prompts.values()
    assert not {t.prompt for t in make_suite("code", 50, seed=5000)} & set(prompts)
    for dim in set(prompts.values()):  # never a held-out prompt of the suite it comes from
        held_out = {t.prompt for t in make_suite(dim, train.HELDOUT_PER_DIMENSION, seed=0)}
        assert not held_out & {p for p, d in prompts.items() if d == dim}


def test_lora_targets_name_only_the_top_layers():
    import re

    spec = train.SPECS[0]
    pattern = re.compile(spec.target_regex(30))
    assert pattern.fullmatch("model.layers.29.self_attn.q_proj")
    assert pattern.fullmatch(f"model.layers.{30 - spec.top_layers}.mlp.down_proj")
    assert not pattern.fullmatch(f"model.layers.{29 - spec.top_layers}.self_attn.q_proj")


def test_keep_counts_per_suite_override_the_default():
    prompts = train.keep_prompts("math", 2, seed=0, counts={"extraction": 12})
    per_suite = {d: sum(v == d for v in prompts.values()) for d in set(prompts.values())}
    assert per_suite["extraction"] == 12 and per_suite["code"] == 2 and "math" not in per_suite
    held_out = {t.prompt for t in make_suite("extraction", train.HELDOUT_PER_DIMENSION, seed=0)}
    assert not held_out & set(prompts)


@pytest.mark.parametrize("spec", train.SPECS, ids=lambda s: s.name)
def test_the_validation_split_is_never_trained_on(spec):
    """Settings are chosen on the validation split (lora_quality.py --seed 9000): neither the adapter's own
    training pairs nor its keep prompts may contain one of its prompts."""
    validation = {
        d: {t.prompt for t in make_suite(d, train.HELDOUT_PER_DIMENSION, seed=train.VALIDATION_SEED)}
        for d in train.KEEP_DIMENSIONS
    }
    trained = {p for p, _ in train.training_pairs(spec.dimension, 480, seed=0)}
    assert not validation[spec.dimension] & trained
    for prompt, dim in train.keep_prompts(spec.dimension, 96, seed=0).items():
        assert prompt not in validation[dim], (dim, prompt)


def _tiny_peft_model():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    base = LlamaForCausalLM(config)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


def test_keep_kl_is_zero_for_an_untouched_adapter_and_grows_with_drift():
    model = _tiny_peft_model()
    rows = [[1, 5, 7, 9, 11, 2], [1, 6, 8, 3]]
    masks = [[0, 0, 0, 1, 1, 1], [0, 0, 1, 1]]
    states = train.lower_states(model.base_model.model, rows, cut=1)
    args = (model, 1, states, masks, rows, [True, False])
    plain = train.top_loss(*args, keep_kl=0.0)
    assert torch.allclose(train.top_loss(*args, keep_kl=5.0), plain)  # LoRA B starts at zero: no drift
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    drifted = train.top_loss(*args, keep_kl=0.0)
    assert train.top_loss(*args, keep_kl=5.0) > drifted + 1e-4
    assert torch.allclose(train.top_loss(model, 1, states, masks, rows, [False, False], keep_kl=5.0), drifted)


def test_code_neighbours_are_never_code_suite_prompts():
    neighbours = train.code_neighbours(128, seed=0)
    assert len(set(neighbours)) == 128
    suite = {t.prompt for s in (0, train.VALIDATION_SEED, *range(1000, 1010)) for t in make_suite("code", 256, seed=s)}
    assert not suite & set(neighbours)
    assert any("`add" in p for p in neighbours) and any("greater than" in p for p in neighbours)
