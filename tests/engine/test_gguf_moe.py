"""GGUF mixture-of-experts files (Mixtral, Qwen2-MoE, Qwen3-MoE, written as llama.cpp writes them by
``tiny_gguf_moe.py``) run by the engine against transformers holding the weights the file decodes to.

The experts stay in the file's encoding (one quantized linear pair per expert over its rows of the
stacked ``ffn_*_exps`` tensors); F32, F16, Q8_0, Q4_0 and Q4_K multiply exactly (float32 activations,
``TOKENOPS_QUANT_EXACT``), Q5_0 is held as Q8_0 (re-encoded: close, not exact).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_gguf_moe import MOE_GGUF_ARCHS, write_moe_gguf
from tokenops.engine.core.batch import ChunkInput

# (arch, experts' type, other weights' type): every family in float and in a quantized mix
CASES = [
    ("mixtral", "F32", "F32"),
    ("qwen2_moe", "F16", "F16"),
    ("qwen3_moe", "Q8_0", "Q4_0"),
    ("mixtral", "Q4_0", "Q8_0"),
    ("qwen2_moe", "Q4_K", "Q8_0"),
    ("qwen3_moe", "Q4_K", "Q4_K"),
    ("mixtral", "Q5_0", "Q8_0"),
]
NUM_NEW = 6


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread (tiny models on a loaded box) and float32 activations in the quantized
    products, as transformers multiplies (see test_gguf_models.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOKENOPS_QUANT_EXACT", "1")
        yield
    torch.set_num_threads(before)


def _runner(path, **kw):
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    return ModelRunner(EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_tokens=256, **kw))


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{e}-{o}" for a, e, o in CASES])
def pair(request, tmp_path_factory):
    arch, experts, others = request.param
    path, hf = write_moe_gguf(arch, tmp_path_factory.mktemp("moe") / f"{arch}.gguf", experts, others)
    return request.param, _runner(path), hf, path


@torch.no_grad()
def test_logits_and_greedy_tokens_match_transformers(pair):
    (arch, experts, _), runner, hf, _ = pair
    ids = torch.randint(0, 256, (13,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = hf(torch.tensor([ids])).logits[0]
    table = list(range(8))
    first = runner.execute([ChunkInput(ids[:6], 0, table)])[0]  # chunked prefill, then paged decode
    logits = runner.execute([ChunkInput(ids[6:], 6, table)])[0]
    scale = ref.abs().max().item()
    # Q5_0 is re-encoded as Q8_0 at load (one more rounding); the other types are the file's values
    atol = 3e-2 * scale if experts == "Q5_0" else 1e-5 * max(scale, 1.0)
    torch.testing.assert_close(first, ref[5], atol=atol, rtol=1e-4)
    torch.testing.assert_close(logits, ref[-1], atol=atol, rtol=1e-4)
    ours, seq = [], list(ids)
    for _ in range(NUM_NEW):
        token = int(logits.argmax())
        ours.append(token)
        seq.append(token)
        logits = runner.execute([ChunkInput([token], len(seq) - 1, table)])[0]
    hf.generation_config.eos_token_id = None
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      do_sample=False, max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, pad_token_id=0)  # fmt: skip
    assert ours == out[0, len(ids) :].tolist(), arch
    # every token of the three steps was routed to top-k experts of every layer
    load = runner.expert_load()
    assert [sum(row) for row in load] == [(13 + NUM_NEW) * runner.args.num_experts_per_tok] * runner.args.num_layers


def test_experts_stay_in_the_files_encoding(pair):
    """Each expert is a quantized linear pair over its rows of the file's tensors; the stacked float
    parameters are released, so resident weights are about the file's size."""
    from tokenops.engine.gguf.gguf_weights import weight_bytes
    from tokenops.engine.kernels import quant_kernels
    from tokenops.engine.kernels.quantized_linear import QuantizedLinear, QuantizedWeight

    (arch, experts, _), runner, _, path = pair
    model = runner._raw_model
    held = "Q8_0" if experts == "Q5_0" else experts
    for block in model.moe_blocks():
        assert block is not None and block.experts is not None
        assert block.w_gate_up.numel() == 0 and block.w_down.numel() == 0
        assert len(block.experts.gate_up) == runner.args.num_experts
        assert all(isinstance(m, QuantizedLinear) and m.type_names == [held] for m in block.experts.gate_up)
        assert all(isinstance(m, QuantizedLinear) and m.type_names == [held] for m in block.experts.down)
        assert isinstance(block.gate, QuantizedLinear) and block.gate.type_names == ["F32"]
        assert (block.shared_expert is not None) == (arch == "qwen2_moe")
    assert all(p.dim() == 1 for p in model.parameters() if p.numel()), "only norms and biases are float tensors"
    if quant_kernels.get_kernels() is not None:  # packed for the native kernels with the rest of the model
        weights = [w for b in model.moe_blocks() if b and b.experts for w in b.experts.modules()
                   if isinstance(w, QuantizedWeight) and w.ggml_type in quant_kernels.SUPPORTED]  # fmt: skip
        assert all(w.packed is not None for w in weights) and (weights or held in ("F32", "F16"))
    # Q5_0 (5.5 bits a weight) held as Q8_0 (8.5) grows the experts
    assert weight_bytes(model) <= (1.6 if experts == "Q5_0" else 1.2) * path.stat().st_size
    assert runner.is_moe and runner.fused_decode is None  # the fused C step refuses MoE: the torch forward runs


def test_metadata_maps_to_the_families_routing(tmp_path):
    """Mixtral is the llama architecture with an expert count; Qwen2-MoE does not renormalise its
    top-k weights (as llama.cpp runs it) and has a shared expert of its own width."""
    from tokenops.engine.gguf.gguf_reader import GGUFFile, gguf_model_args

    seen = {}
    for arch in MOE_GGUF_ARCHS:
        path, _ = write_moe_gguf(arch, tmp_path / f"{arch}.gguf")
        args, cfg = gguf_model_args(GGUFFile(path))
        seen[arch] = (cfg["architectures"][0], args.num_experts, args.num_experts_per_tok,
                      args.moe_intermediate_size, args.shared_expert_intermediate_size, args.norm_topk_prob)  # fmt: skip
    assert seen == {
        "mixtral": ("MixtralForCausalLM", 4, 2, 256, 0, True),
        "qwen2_moe": ("Qwen2MoeForCausalLM", 4, 2, 256, 256, False),
        "qwen3_moe": ("Qwen3MoeForCausalLM", 4, 2, 256, 0, True),
    }


def _rewrite(src, dst, drop: str = "", metadata: dict | None = None, split_experts: bool = False):
    """``src`` copied to ``dst`` without tensor ``drop``, with ``metadata`` (key -> int) added and
    (``split_experts``) each stacked expert tensor written as one tensor per expert, as llama.cpp's
    converter wrote Mixtral before April 2024 (``blk.N.ffn_gate.E.weight``)."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(reader.fields["general.architecture"].contents()))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value_type = field.types[0]
        if value_type == gguf.GGUFValueType.ARRAY:
            w.add_array(key, field.contents())
        else:
            w.add_key_value(key, field.contents(), value_type)
    for key, value in (metadata or {}).items():
        w.add_uint32(key, value)
    for t in reader.tensors:
        if split_experts and t.name.endswith("_exps.weight"):
            for e, data in enumerate(np.array(t.data)):
                w.add_tensor(t.name.replace("_exps.weight", f".{e}.weight"), data, raw_dtype=t.tensor_type)
        elif t.name != drop:
            w.add_tensor(t.name, np.array(t.data), raw_shape=None, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_missing_expert_tensor_and_unsupported_gating_are_one_line_errors(tmp_path):
    from tokenops.engine.models.loader import UnsupportedModelError

    path, _ = write_moe_gguf("qwen3_moe", tmp_path / "ok.gguf", "Q8_0", "Q8_0")
    broken = _rewrite(path, tmp_path / "no-down.gguf", drop="blk.1.ffn_down_exps.weight")
    with pytest.raises(UnsupportedModelError) as err:
        _runner(broken)
    assert "blk.1.ffn_down_exps.weight" in str(err.value) and "\n" not in str(err.value)
    sigmoid = _rewrite(path, tmp_path / "sigmoid.gguf", metadata={"qwen3moe.expert_gating_func": 2})
    with pytest.raises(UnsupportedModelError, match=r"qwen3moe.expert_gating_func 2 is not supported"):
        _runner(sigmoid)


@torch.no_grad()
def test_older_mixtral_files_with_one_tensor_per_expert(tmp_path):
    import gguf

    path, hf = write_moe_gguf("mixtral", tmp_path / "stacked.gguf", "Q8_0", "Q8_0")
    older = _rewrite(path, tmp_path / "per-expert.gguf", split_experts=True)
    assert "blk.0.ffn_down.3.weight" in {t.name for t in gguf.GGUFReader(str(older)).tensors}
    ids = list(range(40, 51))
    ref = hf(torch.tensor([ids])).logits[0, -1]
    logits = _runner(older).execute([ChunkInput(ids, 0, list(range(8)))])[0]
    torch.testing.assert_close(logits, ref, atol=1e-5 * max(ref.abs().max().item(), 1.0), rtol=1e-4)
