"""Tiny random Hugging Face checkpoints for engine tests (transformers is the oracle).

``make_tiny_checkpoint(arch, tmp_path)`` writes ``config.json`` + ``model.safetensors``
(via ``save_pretrained``) + a small byte-level BPE tokenizer with a chat template,
and returns the folder. ``load_hf_model(path)`` loads it back with transformers
(eager attention, float32) for comparisons. Weights are re-drawn with a larger
spread than HF's default init so attention is far from uniform and greedy
choices are not near ties.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

ARCHS = ("llama", "qwen2", "qwen2_sliding", "qwen3", "mistral", "mixtral", "qwen2_moe", "qwen3_moe",
         "gemma", "gemma2", "gemma3", "phi3", "phi3_longrope")
MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")
VOCAB_SIZE = 320
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRAINING_TEXT = [
    "the quick brown fox jumps over the lazy dog. hello world! hello there.",
    "emoji 😀😃😄 and more 🎉🎉 party, 中文字符 日本語 한국어 text",
    "def forward(self, x): return self.linear(x) + x  # residual",
] * 20

_COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=258,
    pad_token_id=256,
)


def hf_config(arch: str):
    """The transformers config object for a tiny model of ``arch``."""
    import transformers as tf

    c = dict(_COMMON)
    if arch == "llama":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32, "rope_theta": 10000.0}  # fmt: skip
        return tf.LlamaConfig(**c, rope_parameters=rope)
    if arch == "qwen2":  # MQA, tied embeddings, q/k/v bias
        return tf.Qwen2Config(**{**c, "num_key_value_heads": 1}, tie_word_embeddings=True)
    if arch == "qwen2_sliding":  # only layer 1 uses a 5-token window
        return tf.Qwen2Config(**c, use_sliding_window=True, sliding_window=5, max_window_layers=1)
    if arch == "qwen3":  # head_dim != hidden/heads, q/k norm
        return tf.Qwen3Config(**c, head_dim=32)
    if arch == "qwen3_hd128":  # the head size of most released models (the fused step's 64-lane value pass)
        return tf.Qwen3Config(**c, head_dim=128)
    if arch == "mistral":
        return tf.MistralConfig(**c, sliding_window=6)
    if arch == "mistral_h12":  # 12 heads of 8 on 3 KV heads: the fused step scores 8 heads per vector + 4 alone
        return tf.MistralConfig(**{**c, "hidden_size": 96, "num_attention_heads": 12, "num_key_value_heads": 3},
                                head_dim=8, sliding_window=6)
    if arch == "mixtral":
        return tf.MixtralConfig(**c, num_local_experts=4, num_experts_per_tok=2)
    if arch == "qwen2_moe":  # layer 1 dense via mlp_only_layers; shared expert
        return tf.Qwen2MoeConfig(**c, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                 shared_expert_intermediate_size=96, norm_topk_prob=False, mlp_only_layers=[1])  # fmt: skip
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**c, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True)
    if arch == "gemma":  # Gemma 1: scaled embeddings, (1 + w) norms, GELU, tied; head_dim 16 (not hidden / heads)
        return tf.GemmaConfig(**{**c, "num_attention_heads": 2, "num_key_value_heads": 1}, head_dim=16)
    if arch == "gemma2":  # soft caps low enough to bite, a 5-token window on layer 0, scale from 24 not 16
        return tf.Gemma2Config(**c, head_dim=16, query_pre_attn_scalar=24, sliding_window=5,
                               attn_logit_softcapping=3.0, final_logit_softcapping=5.0)
    if arch == "gemma3":  # q/k norms; local layer 0 (theta 1e4, window 5), global layer 1 (theta 1e6, linear x8)
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}
        return tf.Gemma3TextConfig(**c, head_dim=16, query_pre_attn_scalar=24, sliding_window=5, rope_parameters=rope,
                                   layer_types=["sliding_attention", "full_attention"])
    if arch == "gemma2_gguf":  # what transformers assumes of a Gemma 2 GGUF: head_dim 256 = query_pre_attn_scalar, caps 50/30
        return tf.Gemma2Config(**{**c, "num_attention_heads": 2, "num_key_value_heads": 1}, head_dim=256,
                               query_pre_attn_scalar=256, sliding_window=5)
    if arch == "gemma3_gguf":  # six layers: five local, the sixth global (the pattern a GGUF implies)
        return tf.Gemma3TextConfig(**{**c, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 6},
                                   head_dim=256, query_pre_attn_scalar=256, sliding_window=5)
    if arch == "phi3":  # fused qkv/gate_up weights, window 7, full rotation: the fused step runs it
        return tf.Phi3Config(**c, sliding_window=7)
    if arch == "phi3_gguf":  # no window: transformers reads none from a Phi-3 GGUF
        return tf.Phi3Config(**c)
    if arch == "phi3_longrope":  # half the head rotates; LongRoPE (short factors below 64 tokens)
        factors = {"short_factor": [1.0, 1.5, 2.0, 4.0], "long_factor": [2.0, 3.0, 5.0, 9.0]}
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, **factors}
        return tf.Phi3Config(**c, rope_parameters=rope, original_max_position_embeddings=64)
    raise ValueError(f"unknown tiny arch {arch!r}; choose from {ARCHS}")


def hf_model_class(arch: str):
    import transformers as tf

    return {
        "llama": tf.LlamaForCausalLM, "qwen2": tf.Qwen2ForCausalLM, "qwen2_sliding": tf.Qwen2ForCausalLM,
        "qwen3": tf.Qwen3ForCausalLM, "qwen3_hd128": tf.Qwen3ForCausalLM, "mistral": tf.MistralForCausalLM, "mistral_h12": tf.MistralForCausalLM, "mixtral": tf.MixtralForCausalLM,
        "qwen2_moe": tf.Qwen2MoeForCausalLM, "qwen3_moe": tf.Qwen3MoeForCausalLM,
        "gemma": tf.GemmaForCausalLM, "gemma2": tf.Gemma2ForCausalLM, "gemma3": tf.Gemma3ForCausalLM, "phi3": tf.Phi3ForCausalLM,
        "phi3_longrope": tf.Phi3ForCausalLM, "gemma2_gguf": tf.Gemma2ForCausalLM, "gemma3_gguf": tf.Gemma3ForCausalLM,
        "phi3_gguf": tf.Phi3ForCausalLM,
    }[arch]  # fmt: skip


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    """A byte-level BPE (256 bytes + merges trained on mixed-script text + specials)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 8,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def write_tokenizer(path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = tiny_tokenizer()
    assert tok.token_to_id("<|im_end|>") is not None
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )
    fast.save_pretrained(str(path))


def make_tiny_checkpoint(arch: str, tmp_path: Path, seed: int = 0) -> Path:
    """Write a tiny random ``arch`` checkpoint under ``tmp_path/arch`` and return it."""
    config = hf_config(arch)
    tok = tiny_tokenizer()
    config.eos_token_id = tok.token_to_id("<|im_end|>")
    config.pad_token_id = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    model = hf_model_class(arch)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    path = Path(tmp_path) / arch
    model.save_pretrained(str(path))
    write_tokenizer(path)
    return path


def load_hf_model(path: Path):
    """The transformers model of a tiny checkpoint (float32, eager attention, eval)."""
    import json

    import transformers as tf

    arch = json.loads((Path(path) / "config.json").read_text())["architectures"][0]
    cls = getattr(tf, arch)
    model = cls.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    return model.eval()
