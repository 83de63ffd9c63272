import pytest
import torch
from tokenops.config import Settings
from tokenops_plugins.compute_model.compile import CompileModel

compile_plugin = CompileModel()  # one gateway's instance


@pytest.fixture
def enabled():
    s = Settings()
    s.plugins["compile"] = {"enabled": True}
    compile_plugin.tokenops_configure(s)
    yield
    compile_plugin.conf.update({"enabled": False, "mode": "default", "dynamic": True, "scope": "mlp"})


def test_off_by_default():
    assert compile_plugin.tokenops_compile_model(torch.nn.Linear(2, 2)) is None


def test_bad_mode_rejected():
    s = Settings()
    s.plugins["compile"] = {"mode": "fastest"}
    with pytest.raises(ValueError, match="mode must be"):
        compile_plugin.tokenops_configure(s)


def test_mlp_scope_compiles_only_stable_modules(enabled):
    class GatedMLP(torch.nn.Module):
        def forward(self, x):
            return x

    class Attention(torch.nn.Module):
        def forward(self, x):
            return x

    model = torch.nn.Sequential(GatedMLP(), Attention())
    compile_plugin.tokenops_compile_model(model)
    assert "forward" in vars(model[0])  # the feed-forward's forward is replaced by a compiled one
    assert "forward" not in vars(model[1])  # attention stays eager


@pytest.mark.slow
def test_compiled_forward_matches_eager(enabled):
    compile_plugin.conf["scope"] = "model"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    ref = model(x)
    out = compile_plugin.tokenops_compile_model(model)
    assert out is model
    assert torch.allclose(out(x), ref, atol=1e-5)
    assert out(torch.randn(5, 8)).shape == (5, 4)  # a new batch size reuses the dynamic graph
