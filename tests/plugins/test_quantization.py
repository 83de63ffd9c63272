import pytest
import torch
from torch import nn

from tokenops_plugins.model_optimization._quant_layers import Int4Linear, Int8Linear, quantize_model, weight_bytes


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(256, 512, bias=True)
        self.down = nn.Linear(512, 256, bias=False)
        self.lm_head = nn.Linear(256, 100, bias=False)

    def forward(self, x):
        return self.lm_head(self.down(torch.relu(self.up(x))))


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TinyMLP()


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_int8_close_and_four_times_smaller(model):
    x = torch.randn(4, 256)
    ref = model(x)
    before = weight_bytes(model.up) + weight_bytes(model.down)
    assert quantize_model(model, "int8") == 2
    assert isinstance(model.up, Int8Linear) and isinstance(model.lm_head, nn.Linear)
    after = weight_bytes(model.up) + weight_bytes(model.down)
    assert after < before / 3.5
    assert rel_err(model(x), ref) < 0.01


def test_int4_group_dequant_exact_roundtrip_and_eight_times_smaller(model):
    x = torch.randn(4, 256)
    ref = model(x)
    w = model.down.weight.detach().clone()
    before = weight_bytes(model.down)
    quantize_model(model, "int4", group_size=64)
    assert isinstance(model.down, Int4Linear)
    deq = model.down.dequantized(torch.float32)
    # each weight lands within half a quantization step of its group's grid
    groups_err = (deq - w).abs().view(256, -1, 64).amax(-1)
    assert torch.all(groups_err <= model.down.scale.squeeze(-1) / 2 + 1e-6)
    assert weight_bytes(model.down) < before / 6
    assert rel_err(model(x), ref) < 0.15


def test_unknown_mode_rejected(model):
    with pytest.raises(ValueError, match="quantization mode"):
        quantize_model(model, "int3")


def test_hook_applies_configured_mode(model):
    from tokenops.config import load_settings
    from tokenops_plugins.model_optimization import quantization as q

    settings = load_settings(None, environ={})
    settings.plugins["quantization"] = {"weights": "int8"}
    q.tokenops_configure(settings)
    try:
        out = q.tokenops_transform_model(model, config=None)
        assert out is model and isinstance(model.up, Int8Linear)
    finally:
        q._settings["weights"] = "none"


@pytest.mark.parametrize("bias", [False, True])
def test_int8_few_rows_use_the_native_kernel_and_match_dequantized(bias, monkeypatch):
    from tokenops.engine.kernels.native import get_kernel
    from tokenops_plugins.model_optimization import _quant_layers

    if get_kernel() is None:
        pytest.skip("no C compiler: Int8Linear dequantizes for every row count")
    torch.manual_seed(0)
    lin = nn.Linear(96, 40, bias=bias)
    layer = Int8Linear(lin)
    calls = []
    real = _quant_layers._q8_kernel
    monkeypatch.setattr(_quant_layers, "_q8_kernel", lambda: calls.append(1) or real())
    for rows in (1, 2, 5):
        x = torch.randn(rows, 96)
        expected = nn.functional.linear(x, layer.dequantized(torch.float32), layer.bias)
        torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    assert len(calls) == 2  # rows 1 and 2 went through the kernel, 5 rows dequantized
