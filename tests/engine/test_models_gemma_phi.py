"""Gemma (1, 2, 3) and Phi-3 beyond the shared parity tests (test_models_parity.py runs
them against transformers like every family): LongRoPE past the original context, which
step each model takes (fused C step or PyTorch forward), and config spellings."""

from __future__ import annotations

import json

import pytest
import torch

from test_models_parity import hf_greedy, scattered_blocks
from tiny_models import load_hf_model
from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.models.loader import UnsupportedModelError, model_args


@torch.no_grad()
def test_longrope_uses_long_factors_past_the_original_context(tiny_checkpoint, make_runner):
    """A 70-token prompt is past the tiny Phi-3's original 64: transformers rotates the whole
    prefill and every decode with the long factors, and so must we."""
    path = tiny_checkpoint("phi3_longrope")
    runner, hf = make_runner(path), load_hf_model(path)
    ids = torch.randint(0, 300, (70,), generator=torch.Generator().manual_seed(7)).tolist()
    table = scattered_blocks(21, 5)  # 84 slots
    row = runner.execute([ChunkInput(ids, 0, table)])[0]
    torch.testing.assert_close(row, hf(torch.tensor([ids])).logits[0, -1], atol=1e-4, rtol=1e-4)
    out, seq = [], list(ids)
    for _ in range(6):
        out.append(int(row.argmax()))
        seq.append(out[-1])
        row = runner.execute([ChunkInput([out[-1]], len(seq) - 1, table)])[0]
    assert out == hf_greedy(hf, ids, 6)
    # Below 64 tokens the short factors hold (the parity tests); the two tables differ.
    assert not torch.equal(runner.model.inv_freq, runner.model.inv_freq_long)


def test_each_model_takes_the_step_it_can_run(tiny_checkpoint, make_runner):
    """Plain Phi-3 is Llama-shaped and takes the fused C step, and so do Gemma 1/2/3 (their norms,
    embedding scale, GELU, sandwich norms, soft caps and local rotary table are computed there);
    Phi-3's partial rotation and LongRoPE keep the PyTorch forward; Gemma 2's soft-capped scores keep
    the compiled attention kernel (the PyTorch forward's) off."""
    from tokenops.engine.kernels import fused_decode

    if fused_decode._library() is None:
        pytest.skip("no C compiler: every model takes the PyTorch forward")
    for arch in ("phi3", "gemma", "gemma2", "gemma3"):
        assert make_runner(tiny_checkpoint(arch)).fused_decode is not None, arch
    assert make_runner(tiny_checkpoint("phi3_longrope")).fused_decode is None
    gemma2 = make_runner(tiny_checkpoint("gemma2"))
    assert gemma2.native_attention is None
    with pytest.raises(ValueError, match="soft-caps attention scores"):
        make_runner(tiny_checkpoint("gemma2"), attention_backend="native")
    from tokenops.engine.kernels.fused_decode import ineligible_reason

    runner = make_runner(tiny_checkpoint("phi3_longrope"), decode_kernel="torch")
    assert ineligible_reason(runner.model, runner.kv_cache, runner.device) == "partial rotary embeddings"


def test_gemma2_int8_kv_cache_soft_caps_too(tiny_checkpoint, make_runner):
    """The int8 cache attends through the same soft-capped path (close to the float cache)."""
    path = tiny_checkpoint("gemma2")
    ids = list(range(5, 25))
    exact = make_runner(path).execute([ChunkInput(ids, 0, [0, 1, 2, 3, 4])])[0]
    runner = make_runner(path, kv_cache_dtype="int8")
    runner.execute([ChunkInput(ids[:-1], 0, [0, 1, 2, 3, 4])])
    last = runner.execute([ChunkInput(ids[-1:], len(ids) - 1, [0, 1, 2, 3, 4])])[0]
    assert int(last.argmax()) == int(exact.argmax())
    assert torch.nn.functional.cosine_similarity(last, exact, dim=0) > 0.999


def _cfg(tiny_checkpoint, arch: str) -> dict:
    return json.loads((tiny_checkpoint(arch) / "config.json").read_text())


def test_older_config_spellings_give_the_same_args(tiny_checkpoint):
    """Hub configs written before transformers 5: no layer_types (Gemma 2 slides on even
    layers, Gemma 3 on all but every sliding_window_pattern-th), Gemma 3's rope_theta +
    rope_local_base_freq + rope_scaling, Phi-3's "su" for LongRoPE, Gemma 1's "gelu" and
    implied head_dim 256."""
    g2 = _cfg(tiny_checkpoint, "gemma2")
    old = {k: v for k, v in g2.items() if k != "layer_types"}
    assert model_args(old) == model_args(g2)
    assert model_args(g2).layer_windows == [5, None]

    g3 = _cfg(tiny_checkpoint, "gemma3")
    old = {k: v for k, v in g3.items() if k not in ("layer_types", "rope_parameters")}
    old.update(sliding_window_pattern=2, rope_theta=1_000_000.0, rope_local_base_freq=10000.0,
               rope_scaling={"type": "linear", "factor": 8.0})
    new, legacy = model_args(g3), model_args(old)
    assert legacy == new
    assert (new.rope_theta, new.local_rope_theta, new.layer_windows) == (1_000_000.0, 10000.0, [5, None])
    assert new.attn_softcap is None and new.final_softcap is None and new.qk_norm

    g1 = _cfg(tiny_checkpoint, "gemma")
    early = {k: v for k, v in g1.items() if k != "head_dim"}
    early["hidden_act"] = "gelu"  # as the first Gemma releases wrote it: transformers reads the tanh approximation
    args = model_args(early)
    assert args.hidden_act == "gelu_pytorch_tanh" and args.head_dim == 256 and args.norm_offset == 1.0
    assert not args.sandwich_norms and args.query_pre_attn_scalar is None and args.tie_word_embeddings

    phi = _cfg(tiny_checkpoint, "phi3_longrope")
    rope = dict(phi.pop("rope_parameters"))
    rope.pop("original_max_position_embeddings")
    phi["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
    phi["rope_theta"] = rope.pop("rope_theta")
    phi["rope_scaling"] = {**rope, "type": "su"}
    del phi["rope_scaling"]["rope_type"]
    args = model_args(phi)
    assert args == model_args(_cfg(tiny_checkpoint, "phi3_longrope"))
    assert args.rotary_dim == 8 and args.rope_scaling["rope_type"] == "longrope"


def test_unsupported_variants_are_one_line_errors(tiny_checkpoint):
    g3 = _cfg(tiny_checkpoint, "gemma3")
    with pytest.raises(UnsupportedModelError, match="Gemma3ForCausalLM: use_bidirectional_attention"):
        model_args({**g3, "use_bidirectional_attention": True})
    phi = _cfg(tiny_checkpoint, "phi3")
    with pytest.raises(UnsupportedModelError, match="Phi3ForCausalLM: unsupported rope_type 'dynamic'.*longrope"):
        model_args({**phi, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}})
    for arch in ("GPT2LMHeadModel", "Gemma3ForConditionalGeneration", "Phi3SmallForCausalLM"):
        with pytest.raises(UnsupportedModelError) as err:
            model_args({**phi, "architectures": [arch]})
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"unsupported architecture {arch}; supported: ")
        assert "Gemma2ForCausalLM" in message and "Phi3ForCausalLM" in message
