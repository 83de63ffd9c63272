"""oneDNN prepacked linear weights (tokenops.engine.kernels.weight_layout) against plain F.linear."""

from __future__ import annotations

import pytest
import torch

from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.models.layers import Linear
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.engine.kernels.weight_layout import onednn_available, pack_linear_weights

from tiny_models import make_tiny_checkpoint

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 5, 64])
def test_packed_linear_matches_f_linear(bias, rows):
    torch.manual_seed(0)
    layer = Linear(48, 80, bias=bias)
    torch.nn.init.normal_(layer.weight)
    if bias:
        torch.nn.init.normal_(layer.bias)
    x = torch.randn(rows, 96)[:, ::2]  # a non-contiguous input too
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    layer.pack()
    assert layer.packed is not None and layer.weight.numel() == 0  # the dense copy is released
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_engine_output_identical_with_and_without_packing(tmp_path):
    path = make_tiny_checkpoint("llama", tmp_path)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13], list(range(20, 60))]
    outs = {}
    for layout in ("plain", "onednn"):
        engine = LLMEngine(EngineConfig(model=str(path), device="cpu", weight_layout=layout, kv_cache_tokens=1024))
        assert engine.runner.weight_layout == layout
        packed = [m for m in engine.runner.model.modules() if type(m) is Linear and m.packed is not None]
        assert bool(packed) == (layout == "onednn")
        outs[layout] = engine.generate(prompts, params)
    for plain, onednn in zip(outs["plain"], outs["onednn"]):
        assert plain.outputs[0].token_ids == onednn.outputs[0].token_ids
        for a, b in zip(plain.outputs[0].logprobs, onednn.outputs[0].logprobs):
            assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)


def test_tied_lm_head_keeps_the_shared_weight(tmp_path):
    from tokenops.engine.models.loader import load_model

    path = make_tiny_checkpoint("qwen2", tmp_path)  # the tiny qwen2 ties its embeddings
    model, args, _ = load_model(path, torch.float32, torch.device("cpu"))
    if not onednn_available():
        assert pack_linear_weights(model, torch.device("cpu"), torch.float32) == "plain"
        return
    assert pack_linear_weights(model, torch.device("cpu"), torch.float32, "onednn") == "onednn"
    assert args.tie_word_embeddings
    assert model.lm_head.packed is not None
    assert model.lm_head.weight.numel() > 0 and model.lm_head.weight is model.model.embed_tokens.weight


def test_layout_choice_and_errors():
    model = torch.nn.Sequential(Linear(4, 4))
    assert pack_linear_weights(model, torch.device("cpu"), torch.bfloat16) == "plain"  # auto: fp32 only
    with pytest.raises(ValueError, match="float32 weights only"):
        pack_linear_weights(model, torch.device("cpu"), torch.bfloat16, "onednn")
    assert pack_linear_weights(model, torch.device("cpu"), torch.float32, "plain") == "plain"
    with pytest.raises(ValueError, match="weight_layout must be"):
        EngineConfig(weight_layout="blocked")


@needs_onednn
def test_auto_packs_only_large_weights():
    from tokenops.engine.kernels.weight_layout import MIN_PACKED_ELEMENTS

    small, large = Linear(64, 64), Linear(512, MIN_PACKED_ELEMENTS // 512)
    model = torch.nn.Sequential(small, large)
    assert pack_linear_weights(model, torch.device("cpu"), torch.float32) == "onednn"
    assert small.packed is None and large.packed is not None
    forced = Linear(64, 64)
    assert pack_linear_weights(torch.nn.Sequential(forced), torch.device("cpu"), torch.float32, "onednn") == "onednn"
    assert forced.packed is not None


@needs_onednn
def test_auto_packs_a_shared_weight_only_while_its_copy_is_small(monkeypatch):
    from tokenops.engine.kernels import weight_layout
    from tokenops.engine.models.layers import Embedding

    def tied():
        embed, head = Embedding(1024, 512), Linear(512, 1024, bias=False)
        head.weight = embed.weight  # tied, and large enough to pack
        return embed, head, torch.nn.ModuleDict({"embed": embed, "head": head})

    embed, head, model = tied()
    assert pack_linear_weights(model, torch.device("cpu"), torch.float32) == "onednn"  # a 2 MB copy
    assert head.packed is not None and head.weight is embed.weight and embed.weight.numel() == 1024 * 512
    monkeypatch.setattr(weight_layout, "MAX_SHARED_COPY_BYTES", 1 << 20)
    embed, head, model = tied()
    assert pack_linear_weights(model, torch.device("cpu"), torch.float32) == "plain"
    assert head.packed is None
    assert pack_linear_weights(model, torch.device("cpu"), torch.float32, "onednn") == "onednn"
    assert head.packed is not None and head.weight is embed.weight and embed.weight.numel() == 1024 * 512


@needs_onednn
def test_a_compiled_forward_is_not_packed_for_onednn():
    """Inductor cannot lower ``mkldnn._linear_pointwise`` on a prepacked weight: under ``auto`` a
    compiled model keeps plain weights (the real torch.compile through serve: the ``compile``
    group of tests/test_docs_examples.py). The demo model's fused gate/up weight is large enough
    for ``auto`` to pack it when the forward is eager."""
    from pathlib import Path

    from tokenops.engine.core.policies import EnginePolicies

    target = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"
    if not (target / "config.json").is_file():
        pytest.skip("demo target not trained")
    seen = []

    def compile_model(model):  # a compiler that compiles: it returns the model
        seen.append(model)
        return model

    def packed(engine: LLMEngine) -> list:
        return [m for m in engine.runner.model.modules() if type(m) is Linear and m.packed is not None]

    config = EngineConfig(model=str(target), device="cpu", decode_kernel="torch", kv_cache_tokens=1024)
    eager = LLMEngine(config, policies=EnginePolicies(compile=lambda model: None))  # the plugin, switched off
    assert not eager.runner.is_compiled and eager.runner.weight_layout == "onednn" and packed(eager)
    compiled = LLMEngine(config, policies=EnginePolicies(compile=compile_model))
    assert seen and compiled.runner.is_compiled and compiled.runner.weight_layout == "plain"
    assert not packed(compiled)
    # a compile plugin that is loaded but off (as in every `tokenops serve`) leaves `auto` to the fused
    # decode step's panels, so the linear weights are held once (it used to turn them off)
    served = LLMEngine(EngineConfig(model=str(target), device="cpu", kv_cache_tokens=1024),
                       policies=EnginePolicies(compile=lambda model: None))
    assert served.runner.fused_decode is not None and served.runner.weight_layout == "panels"
