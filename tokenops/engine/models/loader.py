"""Find and load Hugging Face checkpoints: ``config.json`` + ``*.safetensors``
(single file or sharded with ``model.safetensors.index.json``) + tokenizer files, and
GGUF files (:mod:`tokenops.engine.gguf.gguf_weights`, weights kept quantized).

A model is a local folder, or a hub id found in the local Hugging Face cache. The
hub is contacted (through ``huggingface_hub``) only when the engine config allows
downloads; otherwise a missing model is a :class:`ModelNotFoundError` that says how
to get it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tokenops.engine.models import SUPPORTED_ARCHITECTURES
from tokenops.engine.models.args import ModelArgs
from tokenops.engine.models.llama import CausalLM

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt"]


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a local folder nor in the Hugging Face cache."""


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture (or a feature of it) is not supported."""


def parse_dtype(name: str) -> torch.dtype:
    """``float32`` / ``bfloat16`` / ``float16`` (or fp32/bf16/fp16) as a torch dtype."""
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; use float32, bfloat16 or float16")
    return DTYPES[name]


def resolve_model_dir(model: str | None, allow_download: bool = False) -> Path:
    """The local folder holding ``model``.

    :param model: a folder path, a hub id (``org/name``), or None for the embedded default.
    :param allow_download: fetch from the hub when the model is not cached locally.
    """
    if model is None:
        from tokenops.engine.models.default_model import default_model_dir

        return default_model_dir()
    path = Path(model).expanduser()
    if path.is_file():
        from tokenops.engine.gguf.gguf_reader import is_gguf

        if not is_gguf(path):
            raise ModelNotFoundError(f"{path} is a file but not a GGUF model; point to a .gguf file or a model folder")
        return path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but has no config.json; point to a Hugging Face model folder")
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ModelNotFoundError(f"model {model!r} not found: no such folder, and it is not a hub id like 'org/name'")
    cached = _from_hf_cache(model)
    if cached is not None:
        return cached
    if not allow_download:
        raise ModelNotFoundError(
            f"model {model!r} is not a local folder and not in the Hugging Face cache; download it first "
            f"(`hf download {model}`) or allow downloads (engine.allow_download = true / --allow-download)"
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, allow_patterns=_DOWNLOAD_PATTERNS))
    except Exception as e:  # hub errors come in many types; the user needs the reason
        raise ModelNotFoundError(
            f"could not download {model!r} from the Hugging Face hub: {type(e).__name__}: {e}"
        ) from None


def _from_hf_cache(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo_id, allow_patterns=_DOWNLOAD_PATTERNS, local_files_only=True))
    except Exception:  # not cached (or no huggingface_hub): the caller decides what to say
        return None
    return path if (path / "config.json").is_file() else None


def read_hf_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise ModelNotFoundError(f"{path} has no config.json")
    return json.loads(file.read_text(encoding="utf-8"))


def model_args(hf_config: dict[str, Any]) -> ModelArgs:
    """Validate the architecture and normalise the config."""
    archs = hf_config.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        named = ", ".join(archs) or f"model_type {hf_config.get('model_type')!r}"
        raise UnsupportedModelError(
            f"unsupported architecture {named}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    try:
        return ModelArgs.from_hf(hf_config, arch)
    except KeyError as e:
        raise UnsupportedModelError(f"config.json of {arch} lacks {e.args[0]!r}") from None
    except ValueError as e:
        raise UnsupportedModelError(f"{arch}: {e}") from None


def iter_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint, one file at a time (sharded or single)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = sorted({path / f for f in weight_map.values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{path} has no *.safetensors weights (pytorch_model.bin is not supported)")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(path: Path, dtype: torch.dtype, device: torch.device) -> tuple[CausalLM, ModelArgs, dict[str, Any]]:
    """Build the model for ``path`` directly on ``device`` and load its weights.

    ``path`` is a Hugging Face folder or a GGUF file (whose weights stay quantized).
    :returns: the model (eval mode, no grad), its :class:`ModelArgs` and the raw HF config.
    """
    if path.is_file():
        from tokenops.engine.gguf.gguf_quants import UnsupportedQuantType
        from tokenops.engine.gguf.gguf_reader import GGUFError
        from tokenops.engine.gguf.gguf_weights import load_gguf_model

        try:
            return load_gguf_model(path, dtype, device)
        except (GGUFError, UnsupportedQuantType) as e:
            raise UnsupportedModelError(f"{path.name}: {e}") from None
    hf_config = read_hf_config(path)
    args = model_args(hf_config)
    model = CausalLM(args, device=device, dtype=dtype)
    model.load_weights(iter_safetensors(path))
    model.reset_buffers()
    model.eval().requires_grad_(False)
    return model, args, hf_config


def load_tokenizer(path: Path):
    """The :class:`~tokenops.engine.core.tokenizer.Tokenizer` of a model folder or GGUF file."""
    if path.is_file():
        from tokenops.engine.gguf.gguf_reader import GGUFError, GGUFFile
        from tokenops.engine.gguf.gguf_tokenizer import gguf_tokenizer

        file = GGUFFile(path)
        try:
            return gguf_tokenizer(file)
        except GGUFError as e:
            raise UnsupportedModelError(f"{path.name}: {e}") from None
        finally:
            file.close()
    from tokenops.engine.core.tokenizer import Tokenizer

    return Tokenizer.from_dir(path)
