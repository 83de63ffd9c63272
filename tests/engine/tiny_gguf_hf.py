"""Tiny random GGUF files of Gemma (1, 2, 3) and Phi-3, written with ggml-org's ``gguf``
writer the way llama.cpp's converter writes those architectures: its tensor names (gguf's own
name map), Gemma's norms stored as ``1 + weight``, Phi-3's fused ``attn_qkv``/``ffn_up`` and
LongRoPE factors as tensors, and the tiny byte-level BPE vocabulary as ``tokenizer.ggml.*``.

``write_gguf_from_hf(hf_dir, out)`` converts a tiny checkpoint from ``tiny_models.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tiny_models import CHAT_TEMPLATE, SPECIAL_TOKENS, tiny_tokenizer

_ARCH = {"gemma": "GEMMA", "gemma2": "GEMMA2", "gemma3_text": "GEMMA3", "phi3": "PHI3"}


def write_gguf_from_hf(hf_dir: Path, out: Path, quant: str = "F32") -> Path:
    """The checkpoint in ``hf_dir`` as one GGUF file at ``out`` (2-D weights in ``quant``:
    F32, F16 or Q8_0; norms and rope factors stay F32)."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    model_type = cfg["model_type"]
    arch = getattr(gguf.MODEL_ARCH, _ARCH[model_type])
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    num_layers = cfg["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch, num_layers)
    w = gguf.GGUFWriter(str(out), arch_name)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(num_layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg["rope_parameters"]
    if model_type == "gemma3_text":
        rope = rope["full_attention"]
    w.add_rope_freq_base(rope["rope_theta"])
    if model_type.startswith("gemma"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        if cfg.get("sliding_window"):
            w.add_sliding_window(cfg["sliding_window"])
        if model_type == "gemma2":
            w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    else:  # phi3
        rotary = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        w.add_rope_dimension_count(rotary)
        if cfg.get("sliding_window"):
            w.add_sliding_window(cfg["sliding_window"])
        if rope.get("rope_type") == "longrope":
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
            factor = cfg["max_position_embeddings"] / rope["original_max_position_embeddings"]
            w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(factor) / np.log(rope["original_max_position_embeddings"]))))
            w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    _add_tokenizer(w, cfg)
    tensors = load_file(str(Path(hf_dir) / "model.safetensors"))
    for hf_name, data in sorted(tensors.items()):
        base = hf_name.removesuffix(".weight")
        name = names.get_name(base)
        assert name is not None, hf_name
        data = data.astype(np.float32)
        if base.endswith("norm"):
            if model_type.startswith("gemma"):
                data = data + 1.0  # llama.cpp's converter folds Gemma's (1 + w) into the file
            w.add_tensor(f"{name}.weight", data)
            continue
        encoded, qtype = _encoded(data, quant)
        w.add_tensor(f"{name}.weight", encoded, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _encoded(data: np.ndarray, quant: str):
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, quant)
    if qtype == gguf.GGMLQuantizationType.F32:
        return data, None
    if qtype == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16), None
    return gguf.quants.quantize(data, qtype), qtype


def _add_tokenizer(w, cfg: dict) -> None:
    tok = tiny_tokenizer()
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [""] * cfg["vocab_size"]
    for text, idx in vocab.items():
        tokens[idx] = text
    for i, t in enumerate(tokens):  # the config's vocabulary may be larger than the tokenizer's
        if not t:
            tokens[i] = f"[PAD{i}]"
    types = [3 if t in SPECIAL_TOKENS else 5 if t.startswith("[PAD") else 1 for t in tokens]
    merges = json.loads(tok.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(tok.token_to_id("<|im_end|>"))
    w.add_pad_token_id(tok.token_to_id("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
