"""scripts/restrict_lora_adapters.py: an adapter's A held to its own suite's activations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from restrict_lora_adapters import parse_per_adapter, restrict, rewrite  # noqa: E402


def _moments(x: torch.Tensor) -> torch.Tensor:
    return (x.T @ x).double() / x.shape[0]


def test_own_activations_keep_their_update_and_unseen_directions_lose_it():
    g = torch.Generator().manual_seed(0)
    d, r = 24, 4
    a = torch.randn(r, d, generator=g)
    x_in = torch.zeros(400, d)
    x_in[:, :12] = torch.randn(400, 12, generator=g)  # the own suite excites the first 12 directions
    x_off = torch.zeros(400, d)
    x_off[:, 12:] = torch.randn(400, 12, generator=g)  # the others the last 12
    new = restrict(a, _moments(x_in), _moments(x_off), off_weight=0.0, ridge=1e-4)
    assert torch.allclose(x_in @ new.T, x_in @ a.T, atol=1e-2)
    assert (x_off @ new.T).norm() < 1e-2 * (x_off @ a.T).norm()
    assert new.dtype == a.dtype


def test_full_rank_own_activations_and_no_ridge_change_nothing():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(4, 16, generator=g)
    x = torch.randn(500, 16, generator=g)
    new = restrict(a, _moments(x), _moments(x), off_weight=0.0, ridge=1e-9)
    assert torch.allclose(new, a, atol=1e-5)


def test_the_off_weight_trades_shared_directions_away():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(4, 16, generator=g)
    x_in = torch.randn(500, 16, generator=g)
    x_off = x_in[:, :8] @ torch.randn(8, 16, generator=g)  # the others share half of the span
    norms = []
    for lam in (0.0, 1.0, 10.0):
        new = restrict(a, _moments(x_in), _moments(x_off), off_weight=lam, ridge=1e-6)
        norms.append(float((x_off @ new.T).norm()))
    assert norms[0] > norms[1] > norms[2]


def test_rewrite_keeps_the_format_and_scales_alpha(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(3)
    src = tmp_path / "src"
    src.mkdir()
    name = "base_model.model.model.layers.0.mlp.up_proj"
    weights = {f"{name}.lora_A.weight": torch.randn(2, 8, generator=g).half(),
               f"{name}.lora_B.weight": torch.randn(16, 2, generator=g).half()}
    safetensors.save_file(weights, str(src / "adapter_model.safetensors"))
    (src / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4, "peft_type": "LORA"}))
    x_in = torch.zeros(100, 8)
    x_in[:, :4] = torch.randn(100, 4, generator=g)
    stats_in = {name: ((x_in.T @ x_in).double(), 100)}
    stats_off = {name: (torch.eye(8, dtype=torch.float64) * 100, 100)}
    info = rewrite(src, tmp_path / "dst", stats_in, stats_off, off_weight=0.0, ridge=1e-4, scale=1.5)
    out = safetensors.load_file(str(tmp_path / "dst" / "adapter_model.safetensors"))
    assert set(out) == set(weights) and out[f"{name}.lora_A.weight"].dtype == torch.float16
    assert torch.equal(out[f"{name}.lora_B.weight"], weights[f"{name}.lora_B.weight"])
    assert out[f"{name}.lora_A.weight"][:, 4:].abs().max() < 1e-2  # directions the own rows never excite
    assert json.loads((tmp_path / "dst" / "adapter_config.json").read_text())["lora_alpha"] == 6.0
    assert 0 < info["off_energy_kept_mean"] < 1


def test_per_adapter_values():
    assert parse_per_adapter(["2", "smollm2-code=0.5"], 0.0) == (2.0, {"smollm2-code": 0.5})
    assert parse_per_adapter(None, 1e-3) == (1e-3, {})


def test_second_moments_name_the_modules_as_the_saved_file_does(tmp_path):
    pytest.importorskip("peft")
    safetensors = pytest.importorskip("safetensors.torch")
    from peft import LoraConfig, get_peft_model
    from restrict_lora_adapters import second_moments
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=2, target_modules=["q_proj", "down_proj"]))
    stats = second_moments(model, [[1, 2, 3], [4, 5]])
    model.save_pretrained(tmp_path)
    keys = safetensors.load_file(str(tmp_path / "adapter_model.safetensors"))
    assert {f"{name}.lora_A.weight" for name in stats} == {k for k in keys if ".lora_A." in k}
    total, count = stats[next(n for n in stats if n.endswith("down_proj"))]
    assert count == 5 and total.shape == (32, 32)


def test_off_suite_moments_pool_tokens_or_average_suites():
    from restrict_lora_adapters import combine_off

    long = {"m": (torch.full((2, 2), 90.0, dtype=torch.float64), 90)}  # 90 tokens of mean 1
    short = {"m": (torch.full((2, 2), 30.0, dtype=torch.float64), 10)}  # 10 tokens of mean 3
    pooled, n = combine_off({"code": long, "classification": short}, "tokens")["m"]
    assert n == 100 and torch.allclose(pooled / n, torch.full((2, 2), 1.2, dtype=torch.float64))
    balanced, n = combine_off({"code": long, "classification": short}, "suites")["m"]
    assert n == 1 and torch.allclose(balanced, torch.full((2, 2), 2.0, dtype=torch.float64))
