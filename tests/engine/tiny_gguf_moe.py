"""Tiny random mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) built with transformers and
written as GGUF files the way llama.cpp's converter writes them: Mixtral as architecture ``llama`` with
an expert count and llama.cpp's Q/K row order, ``qwen2moe`` / ``qwen3moe`` otherwise; the experts
stacked into 3-D ``ffn_{gate,up,down}_exps`` tensors, the router ``ffn_gate_inp`` and Qwen2-MoE's
shared-expert gate kept float32 (as llama.cpp's quantizer keeps them), and the
``{arch}.expert_*`` metadata. Every tensor name is checked against the ``gguf`` package's list
for the architecture.

``write_moe_gguf(arch, out, experts=..., others=...)`` returns the file and the transformers model
holding the weights *as the file decodes them* (quantized types are decoded with the ``gguf``
package's numpy reference), so that model is the exact oracle of the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tiny_gguf import _encode, _llama_permute
from tiny_gguf_hf import _add_tokenizer
from tiny_models import VOCAB_SIZE, tiny_tokenizer

MOE_GGUF_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")
_FILE_ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
# HF module suffix (inside model.layers.N.) -> llama.cpp's tensor (inside blk.N.)
_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate": "ffn_gate_inp", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}  # fmt: skip
_TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_FLOAT_ALWAYS = ("ffn_gate_inp", "ffn_gate_inp_shexp")  # routers: llama.cpp's quantizer leaves them float32


def moe_config(arch: str):
    """A two-layer, four-expert (top-2) config of ``arch``, 256 wide so every K-quant fits; every layer
    sparse, as in the released models (llama.cpp names no dense FFN tensors for ``qwen2moe``/``qwen3moe``)."""
    import transformers as tf

    c = dict(vocab_size=VOCAB_SIZE, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)  # fmt: skip
    if arch == "mixtral":
        return tf.MixtralConfig(**c, intermediate_size=256, num_local_experts=4, num_experts_per_tok=2)
    if arch == "qwen2_moe":
        return tf.Qwen2MoeConfig(**c, intermediate_size=512, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=256, shared_expert_intermediate_size=256,
                                 norm_topk_prob=False)  # fmt: skip
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**c, intermediate_size=512, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=256, norm_topk_prob=True, head_dim=64)  # fmt: skip
    raise ValueError(arch)


def _gguf_tensors(hf_name: str, data: np.ndarray, num_heads: int, num_kv: int, permute: bool):
    """``(gguf name, float array, Q/K heads to permute or None)`` for one HF tensor (experts split)."""
    base = hf_name.removesuffix(".weight").removesuffix(".bias")
    suffix = ".bias" if hf_name.endswith(".bias") else ".weight"
    if base in _TOP_NAMES:
        return [(_TOP_NAMES[base] + suffix, data, None)]
    _, _, layer, rest = base.split(".", 3)
    blk = f"blk.{layer}."
    if rest == "mlp.experts.gate_up_proj":  # [E, 2I, H]: gate rows, then up rows
        half = data.shape[1] // 2
        return [(blk + "ffn_gate_exps.weight", data[:, :half], None), (blk + "ffn_up_exps.weight", data[:, half:], None)]
    if rest == "mlp.experts.down_proj":
        return [(blk + "ffn_down_exps.weight", data, None)]
    heads = {"self_attn.q_proj": num_heads, "self_attn.k_proj": num_kv}.get(rest) if permute else None
    return [(blk + _LAYER_NAMES[rest] + suffix, data, heads)]


def _encode_decode(data: np.ndarray, qtype: str, rng: np.random.Generator):
    """``(encoded for the writer, raw type or None, the values the file decodes to)``; a 3-D expert
    tensor is encoded row by row over its flattened ``[E * rows, cols]``."""
    import gguf

    flat = data.reshape(-1, data.shape[-1]).astype(np.float32)
    if qtype == "F16":
        encoded = flat.astype(np.float16)
        return encoded.reshape(data.shape), None, encoded.astype(np.float32).reshape(data.shape)
    raw, raw_type = _encode(flat, qtype, rng)
    if raw_type is None:
        return raw.reshape(data.shape), None, raw.reshape(data.shape)
    decoded = gguf.quants.dequantize(raw, raw_type).astype(np.float32)
    return raw.reshape(*data.shape[:-1], -1), raw_type, decoded.reshape(data.shape)


def write_moe_gguf(arch: str, out: Path, experts: str = "F32", others: str = "F32", seed: int = 0):
    """Write the ``arch`` model to ``out`` (expert tensors in ``experts``, other 2-D weights in
    ``others``; norms, biases and routers float32); return ``(out, transformers model)``."""
    import gguf
    import transformers as tf

    cfg = moe_config(arch)
    tok = tiny_tokenizer()
    cfg.eos_token_id = tok.token_to_id("<|im_end|>")
    cfg.pad_token_id = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    cls = {"mixtral": tf.MixtralForCausalLM, "qwen2_moe": tf.Qwen2MoeForCausalLM, "qwen3_moe": tf.Qwen3MoeForCausalLM}
    model = cls[arch](cfg).float().eval()
    file_arch = _FILE_ARCH[arch]
    allowed = _allowed_names(file_arch, cfg.num_hidden_layers)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), file_arch)
    _add_metadata(w, cfg, arch)
    _add_tokenizer(w, {"vocab_size": cfg.vocab_size})
    state = model.state_dict()
    with torch.no_grad():
        for hf_name, tensor in state.items():
            if hf_name.endswith("norm.weight"):
                tensor.copy_(1.0 + 0.1 * torch.randn_like(tensor))
            elif not hf_name.endswith("inv_freq"):
                tensor.normal_(0.0, 0.08)
        for hf_name, tensor in state.items():
            if hf_name.endswith("inv_freq"):
                continue
            decoded_parts = []
            for name, data, heads in _gguf_tensors(hf_name, tensor.numpy(), cfg.num_attention_heads,
                                                   cfg.num_key_value_heads, permute=arch == "mixtral"):  # fmt: skip
                assert name.removesuffix(".weight").removesuffix(".bias") in allowed, name
                qtype = "F32" if data.ndim == 1 or name.split(".")[-2] in _FLOAT_ALWAYS else (
                    experts if name.split(".")[-2].endswith("_exps") else others)  # fmt: skip
                encoded, raw_type, decoded = _encode_decode(data, qtype, rng)
                decoded_parts.append(decoded)
                if heads is not None:  # quantized rows are self-contained: permuting them permutes the weight
                    encoded = _llama_permute(encoded, heads)
                w.add_tensor(name, np.ascontiguousarray(encoded), raw_dtype=raw_type)
            tensor.copy_(torch.from_numpy(np.concatenate(decoded_parts, axis=1 if len(decoded_parts) > 1 else 0)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out, model


def _allowed_names(file_arch: str, num_layers: int) -> set[str]:
    import gguf

    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == file_arch)
    names = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}
    return {n.format(bid=i) for n in names for i in range(num_layers)}


def _add_metadata(w, cfg, arch: str) -> None:
    w.add_name(f"tiny-{arch}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"] if cfg.rope_parameters else 10000.0)
    w.add_vocab_size(cfg.vocab_size)
    w.add_expert_count(cfg.num_local_experts if arch == "mixtral" else cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if arch == "mixtral":
        w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
        return
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "qwen2_moe":
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    else:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
