"""Tiny random GGUF files for engine tests, written with ggml-org's ``gguf`` writer.

``write_tiny_gguf(path, arch, qtype)`` writes a 2-layer model of family ``arch`` (the
``general.architecture`` keys llama.cpp uses; ``mistral`` is written as llama.cpp writes
Mistral: architecture ``llama`` with "mistral" in ``general.name``, which transformers reads as Llama) whose 2-D weights are in
``qtype``, with llama.cpp's Q/K row order for the llama family, and a byte-level BPE tokenizer
with a ChatML template. Types ``gguf.quants.quantize`` implements are quantized from random
float weights; the K-quants (which it cannot write) get random blocks with bounded scales.
transformers loads the same file (``from_pretrained(dir, gguf_file=...)``), dequantized to
float32: the oracle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, INTERMEDIATE, LAYERS = 256, 512, 2
#: (query heads, KV heads) per family: qwen3 has head_dim 128 (transformers' Qwen3 default, which its
#: GGUF reader keeps: it does not read attention.key_length)
HEADS = {"llama": (4, 2), "mistral": (4, 2), "qwen2": (4, 2), "qwen3": (2, 1)}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "Ġt h", "h e", "Ġth e"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GGUF_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
QTYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# scale ranges for random K-quant blocks, so dequantized weights stay around +-0.05
_K_SCALE = {"Q4_K": (2e-4, 6e-4), "Q5_K": (1e-4, 3e-4), "Q6_K": (1e-5, 3e-5)}
_K_SCALE_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


SPM_PIECES = ["\u2581", "t", "h", "e", "a", "o", "n", "l", "s", "\u2581t", "he", "\u2581the", "\u2581a", "on",
              "\u2581on", "ll", "lo", "\u2581he", "\u2581hell", "\u2581hello", "\u2581s", "es", "\u2581n"]


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: unk, BOS, EOS, the 256 byte-fallback tokens, pieces by score."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES + SPECIALS[1:]
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES) + [3, 3]
    scores = [0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))] + [0.0, 0.0]
    return tokens, scores, types


def byte_tokens() -> list[str]:
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
    merged = [m.replace(" ", "") for m in MERGES]
    return alphabet + merged + SPECIALS


def _llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's Q/K row order (what a real llama GGUF holds)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _encode(w: np.ndarray, qtype: str, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    from gguf import GGMLQuantizationType, quants

    t = GGMLQuantizationType[qtype]
    if qtype == "F32":
        return w.astype(np.float32), None
    if qtype in _K_SCALE:
        from gguf.constants import GGML_QUANT_SIZES

        block, size = GGML_QUANT_SIZES[t]
        raw = rng.integers(0, 256, (w.shape[0], w.shape[1] // block * size), dtype=np.uint8)
        blocks = raw.reshape(-1, size)
        low, high = _K_SCALE[qtype]
        for at in _K_SCALE_OFFSETS[qtype]:
            scales = rng.uniform(low, high, blocks.shape[0]).astype(np.float16)
            blocks[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
        return raw, t
    return quants.quantize(w.astype(np.float32), t), t


def write_tiny_gguf(path: Path, arch: str = "llama", qtype: str = "Q8_0", seed: int = 0, tied: bool = False,
                    tensor_types: dict[str, str] | None = None, tokenizer: str = "gpt2") -> Path:
    """Write the model to ``path`` (a ``.gguf`` file) and return it; ``tensor_types`` gives
    some tensors another type (any that ``gguf.quants.quantize`` writes)."""
    import gguf

    assert arch in GGUF_ARCHS and qtype in QTYPES, (arch, qtype)
    rng = np.random.default_rng(seed)
    file_arch = "llama" if arch == "mistral" else arch
    tokens = byte_tokens() if tokenizer == "gpt2" else spm_vocab()[0]
    vocab = len(tokens)
    heads, kv_heads = HEADS[arch]
    head_dim = HIDDEN // heads
    w = gguf.GGUFWriter(str(path), file_arch)
    # llama.cpp writes Mistral as "llama" with the name saying Mistral (the engine maps it to
    # MistralForCausalLM); transformers only does so for the exact name "mistral", which its gguf
    # reader then fails on, so here it loads the file as the Llama it is (no sliding window)
    w.add_name(f"tiny-{arch}-{qtype}".lower())
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTERMEDIATE)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    if file_arch == "llama":
        w.add_rope_dimension_count(head_dim)
    else:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if tokenizer == "gpt2":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
        w.add_token_merges(MERGES)
        w.add_bos_token_id(tokens.index("<|endoftext|>"))
        w.add_add_bos_token(False)
    else:  # SentencePiece (Llama 2 style): scores, byte fallback, BOS added, a space prefixed
        _, scores, types = spm_vocab()
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(CHAT_TEMPLATE)

    def weight(name: str, out: int, inp: int, permute_heads: int | None = None) -> None:
        data = rng.standard_normal((out, inp)).astype(np.float32) * 0.05
        if permute_heads is not None and file_arch == "llama":
            data = _llama_permute(data, permute_heads)
        encoded, raw_type = _encode(data, (tensor_types or {}).get(name, qtype), rng)
        if raw_type is None:
            w.add_tensor(name, encoded)
        else:
            w.add_tensor(name, encoded, raw_dtype=raw_type)

    def vector(name: str, n: int, around: float = 1.0) -> None:
        w.add_tensor(name, (around + 0.1 * rng.standard_normal(n)).astype(np.float32))

    weight("token_embd.weight", vocab, HIDDEN)
    vector("output_norm.weight", HIDDEN)
    if not tied:
        weight("output.weight", vocab, HIDDEN)
    q, kv = heads * head_dim, kv_heads * head_dim
    for i in range(LAYERS):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", HIDDEN)
        weight(p + "attn_q.weight", q, HIDDEN, heads)
        weight(p + "attn_k.weight", kv, HIDDEN, kv_heads)
        weight(p + "attn_v.weight", kv, HIDDEN)
        if arch == "qwen2":
            for part, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                vector(p + f"{part}.bias", n, around=0.0)
        if arch == "qwen3":
            vector(p + "attn_q_norm.weight", head_dim)
            vector(p + "attn_k_norm.weight", head_dim)
        weight(p + "attn_output.weight", HIDDEN, q)
        vector(p + "ffn_norm.weight", HIDDEN)
        weight(p + "ffn_gate.weight", INTERMEDIATE, HIDDEN)
        weight(p + "ffn_up.weight", INTERMEDIATE, HIDDEN)
        weight(p + "ffn_down.weight", HIDDEN, INTERMEDIATE)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def load_hf_gguf(path: Path):
    """The same file in transformers (dequantized to float32, eager attention)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype="float32",
                                                 attn_implementation="eager")
    return model.eval()
