"""The demo models' chat template, learning-rate schedule and HF-folder writer.

Shared by ``scripts/train_demo_models.py`` (which trains the demo family), the task
training in ``tokenops_plugins.multi_model._task_training`` and ``tokenops distill train``. Light to import:
torch and transformers load inside :func:`save_model` only.
"""

from __future__ import annotations

import math
from pathlib import Path

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
PAD, BOS, EOS, IM_START, IM_END = SPECIAL_TOKENS
# ChatML-like; bos_token is part of the template so that encoding the rendered
# prompt (with or without add_special_tokens) gives exactly one <|bos|>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def render(messages: list[dict]) -> str:
    """The chat template applied in Python (identical text, no jinja needed here)."""
    body = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return BOS + body


def lr_at(step: int, num_steps: int, peak: float, num_warmup: int) -> float:
    """Linear warmup then cosine decay to 10% of peak; warmup does not depend on num_steps."""
    if step < num_warmup:
        return peak * (step + 1) / num_warmup
    progress = min(1.0, (step - num_warmup) / max(1, num_steps - num_warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def save_model(model, out_dir: Path, tokenizer_dir: Path) -> None:
    """bf16 safetensors + config + generation config + a copy of the tokenizer files."""
    import torch
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.output_router_logits = False
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=[4, 2], pad_token_id=0, do_sample=False).save_pretrained(out_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if tokenizer_dir != out_dir:
            (out_dir / name).write_bytes((tokenizer_dir / name).read_bytes())
