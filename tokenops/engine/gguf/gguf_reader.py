"""GGUF files: metadata -> the engine's :class:`ModelArgs`, tensors -> raw blocks.

A GGUF file (llama.cpp's format) carries the architecture's hyper-parameters as
``{arch}.*`` keys, the tokenizer as ``tokenizer.ggml.*`` and the weights under llama.cpp's
tensor names (``blk.N.attn_q.weight``...). The file is read with ggml-org's own ``gguf``
package. :data:`GGUF_ARCHITECTURES` maps a ``general.architecture`` to the Hugging Face
family the engine runs: extend it (one row, plus the tensor names in
:mod:`tokenops.engine.gguf.gguf_weights` if the family has new ones) to add an architecture.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenops.engine.models.args import ModelArgs


class GGUFError(ValueError):
    """The GGUF file cannot be served (architecture, tensor type, missing metadata)."""


@dataclass(frozen=True, slots=True)
class GGUFArchitecture:
    """How one ``general.architecture`` maps onto the engine's model families.

    ``permuted_qk``: llama.cpp's converter reorders the rows of Q and K of this family for its
    interleaved (non-NeoX) rotary embedding; the loader puts them back in Hugging Face order.
    ``hf_config``: extra ``config.json`` entries that the metadata does not carry.
    """

    architecture: str
    model_type: str
    permuted_qk: bool
    hf_config: tuple[tuple[str, Any], ...] = ()


GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "llama": GGUFArchitecture("LlamaForCausalLM", "llama", permuted_qk=True),
    # llama.cpp writes Mistral 7B as "llama" (see gguf_architecture); this row is for files that say "mistral"
    "mistral": GGUFArchitecture("MistralForCausalLM", "mistral", permuted_qk=True),
    "qwen2": GGUFArchitecture("Qwen2ForCausalLM", "qwen2", permuted_qk=False),
    "qwen3": GGUFArchitecture("Qwen3ForCausalLM", "qwen3", permuted_qk=False),
    "gemma": GGUFArchitecture(
        "GemmaForCausalLM", "gemma", permuted_qk=False, hf_config=(("hidden_activation", "gelu_pytorch_tanh"),)
    ),
    "gemma2": GGUFArchitecture(
        "Gemma2ForCausalLM", "gemma2", permuted_qk=False, hf_config=(("hidden_activation", "gelu_pytorch_tanh"),)
    ),
    "gemma3": GGUFArchitecture(
        "Gemma3ForCausalLM", "gemma3_text", permuted_qk=False, hf_config=(("hidden_activation", "gelu_pytorch_tanh"),)
    ),
    "phi3": GGUFArchitecture("Phi3ForCausalLM", "phi3", permuted_qk=False),
    # mixture-of-experts: llama.cpp writes Mixtral as "llama" with an expert count (see gguf_architecture)
    "qwen2moe": GGUFArchitecture("Qwen2MoeForCausalLM", "qwen2_moe", permuted_qk=False),
    "qwen3moe": GGUFArchitecture("Qwen3MoeForCausalLM", "qwen3_moe", permuted_qk=False),
}
_MIXTRAL = GGUFArchitecture("MixtralForCausalLM", "mixtral", permuted_qk=True)
# whether the top-k routing weights are renormalised, where the file does not say
# (``{arch}.expert_weights_norm``): as llama.cpp runs each family
_NORM_TOPK = {"mixtral": True, "qwen2_moe": False, "qwen3_moe": True}
_SOFTMAX_GATING = 1  # llama.cpp's expert_gating_func for softmax over the router logits


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a GGUF file (by its magic bytes, so a renamed file still counts)."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(4) == b"GGUF"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Where one tensor lies in the file: ggml ``shape`` (innermost first), type, byte range."""

    name: str
    shape: tuple[int, ...]
    tensor_type: int
    offset: int
    num_bytes: int


def _read_with_gguf(path: Path) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int, int]]]:
    """:func:`~tokenops.engine.gguf.gguf_header.read_header`'s result through ggml-org's ``GGUFReader``
    (the files that reader does not take). What is needed is copied out and the reader dropped at once:
    its hundreds of thousands of small objects for a 49k vocabulary would otherwise be interleaved
    with the model's long-lived objects, and the allocator could not give their memory back (~80 MiB
    more RSS measured on SmolLM2)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path), "r")
    metadata = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    tensors = [
        (t.name, tuple(int(n) for n in t.shape), int(t.tensor_type), int(t.data_offset), int(t.n_bytes))
        for t in reader.tensors
    ]
    del reader
    return metadata, tensors


_Header = tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int, int]]]
#: headers read inside :func:`reusing_headers` (this thread's, as engines are built on threads of their own)
_SHARED_HEADERS: ContextVar[dict[tuple[str, int, int], _Header] | None] = ContextVar("gguf_headers", default=None)


@contextlib.contextmanager
def reusing_headers() -> Iterator[None]:
    """Within the block a file's header is read once: an engine build opens its GGUF file for the
    weights and again for the tokenizer: SmolLM2's engine build took 0.27 s against 0.31 s with two
    reads (quiet box; a read of its 49k-token vocabulary took ~0.12 s on a loaded one). The headers
    (~12 MiB for SmolLM2) are dropped when the block ends."""
    token = _SHARED_HEADERS.set({})
    try:
        yield
    finally:
        _SHARED_HEADERS.reset(token)


def _read_header(path: Path) -> _Header:
    shared = _SHARED_HEADERS.get()
    if shared is not None:  # within an engine build
        st = path.stat()
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
        if key not in shared:
            shared[key] = _read_header_now(path)
        return shared[key]
    return _read_header_now(path)


def _read_header_now(path: Path) -> _Header:
    from tokenops.engine.gguf.gguf_header import UnsupportedHeader, read_header

    try:  # the header in one pass (tokenops/engine/gguf/gguf_header.py: ~20x faster than GGUFReader)
        return read_header(path)
    except UnsupportedHeader:
        return _read_with_gguf(path)


class GGUFFile:
    """An open GGUF file: ``metadata`` (key -> Python value) and ``tensors`` (name -> :class:`TensorInfo`).

    The header is read by :mod:`tokenops.engine.gguf.gguf_header` (ggml-org's ``GGUFReader`` for what that
    does not take). Tensor bytes are read from a plain ``numpy.memmap`` of the file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.metadata, tensors = _read_header(self.path)
        except (ValueError, OSError, struct.error, KeyError) as e:
            raise GGUFError(f"{self.path} is not a readable GGUF file: {e}") from None
        self.tensors = {t[0]: TensorInfo(*t) for t in tensors}
        # copy-on-write ("c"): writable for torch.from_numpy, the file itself is never written
        self._map: np.memmap | None = np.memmap(self.path, mode="c", dtype=np.uint8)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_key(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.metadata.get('general.architecture')}.{key}", default)

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors

    def tensor_type(self, name: str) -> int:
        return self.tensors[name].tensor_type

    def raw_view(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 ``[rows, row_bytes]``: a read-only view of the file mapping
        (copy what you keep: the mapping goes with :meth:`close`)."""
        assert self._map is not None, "GGUFFile is closed"
        t = self.tensors[name]
        rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        return self._map[t.offset : t.offset + t.num_bytes].reshape(rows, -1)

    def raw_rows(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 ``[rows, row_bytes]`` (a private copy)."""
        return np.array(self.raw_view(name))

    def float_tensor(self, name: str) -> np.ndarray:
        """A float tensor (norms, biases) as a flat float32 array."""
        import torch

        from tokenops.engine.gguf.gguf_quants import dequantize, quant_type

        qt = quant_type(self.tensors[name].tensor_type, name)
        return dequantize(torch.from_numpy(self.raw_rows(name)), qt).numpy().reshape(-1)

    @property
    def num_bytes(self) -> int:
        return self.path.stat().st_size

    def close(self) -> None:
        self._map = None


def gguf_architecture(file: GGUFFile) -> tuple[str, GGUFArchitecture]:
    """``(general.architecture, its table row)``; Mistral written as "llama" maps to Mistral."""
    name = str(file.get("general.architecture", ""))
    row = GGUF_ARCHITECTURES.get(name)
    if row is None:
        raise GGUFError(f"GGUF architecture {name!r} is not supported; supported: {', '.join(GGUF_ARCHITECTURES)}")
    if name == "llama" and file.arch_key("expert_count"):
        row = _MIXTRAL
    elif name == "llama" and "mistral" in str(file.get("general.name", "")).lower():
        row = GGUFArchitecture("MistralForCausalLM", "mistral", permuted_qk=True)
    return name, row


def hf_config(file: GGUFFile) -> dict[str, Any]:
    """The ``config.json`` equivalent of the file's metadata (what :class:`ModelArgs` reads)."""
    arch_name, row = gguf_architecture(file)
    key = file.arch_key

    def need(name: str) -> Any:
        value = key(name)
        if value is None:
            raise GGUFError(f"GGUF metadata lacks {arch_name}.{name}")
        return value

    hidden = int(need("embedding_length"))
    num_heads = int(need("attention.head_count"))
    num_kv = key("attention.head_count_kv", num_heads)
    if isinstance(num_kv, list):
        raise GGUFError("GGUF files with a per-layer KV head count are not supported")
    head_dim = key("attention.key_length") or hidden // num_heads
    tokens = file.get("tokenizer.ggml.tokens")
    vocab = key("vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        vocab = int(file.tensors["token_embd.weight"].shape[1])
    cfg: dict[str, Any] = {
        "architectures": [row.architecture],
        "model_type": row.model_type,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        # a MoE file may have no dense layer, and then no dense width
        "intermediate_size": int(key("feed_forward_length", 0) if key("expert_count") else need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(num_kv),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(key("context_length", 2048)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": not file.has_tensor("output.weight"),
        "attention_bias": file.has_tensor("blk.0.attn_q.bias"),
        "qkv_bias": file.has_tensor("blk.0.attn_q.bias"),
        "bos_token_id": file.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": file.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = key("rope.scaling.type")
    if scaling in ("linear",):
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise GGUFError(f"GGUF rope scaling {scaling!r} is not supported (only linear)")
    window = key("attention.sliding_window")
    if window:
        cfg["sliding_window"] = int(window)
        if row.model_type.startswith("qwen"):
            cfg["use_sliding_window"] = True
    cfg.update(dict(row.hf_config))
    if arch_name in ("gemma2", "gemma3"):
        cfg.update(_gemma_config(file, arch_name, cfg))
    elif arch_name == "phi3":
        cfg.update(_phi3_config(file, cfg))
    if key("expert_count"):
        cfg.update(_moe_config(file, arch_name, cfg))
    return cfg


def _moe_config(file: GGUFFile, arch_name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The experts: counts and widths from the metadata (else the tensors' shapes), which layers
    are sparse (those with a router, ``ffn_gate_inp``), and the routing llama.cpp applies."""
    key = file.arch_key
    layers = range(cfg["num_hidden_layers"])
    sparse = [i for i in layers if file.has_tensor(f"blk.{i}.ffn_gate_inp.weight")]
    if not sparse:
        raise GGUFError(f"GGUF {arch_name} file has {arch_name}.expert_count but no router tensor blk.N.ffn_gate_inp")
    gating = key("expert_gating_func")
    if gating is not None and int(gating) != _SOFTMAX_GATING:
        raise GGUFError(f"GGUF {arch_name}.expert_gating_func {gating} is not supported (only softmax, 1)")
    scale = key("expert_weights_scale")
    if scale is not None and float(scale) != 1.0:
        raise GGUFError(f"GGUF {arch_name}.expert_weights_scale {scale} is not supported (only 1.0)")
    used = key("expert_used_count")
    if not used:
        raise GGUFError(f"GGUF metadata lacks {arch_name}.expert_used_count")

    def width(meta: str, tensor: str, default: int) -> int:
        name = f"blk.{sparse[0]}.{tensor}.weight"
        shape = file.tensors[name].shape if file.has_tensor(name) else None
        return int(key(meta) or (shape[1] if shape is not None and len(shape) > 1 else default))

    norm = key("expert_weights_norm")
    model_type = cfg["model_type"]
    return {
        "num_experts": int(key("expert_count")),
        "num_experts_per_tok": int(used),
        "moe_intermediate_size": width("expert_feed_forward_length", "ffn_gate_exps", cfg["intermediate_size"]),
        "shared_expert_intermediate_size": width("expert_shared_feed_forward_length", "ffn_gate_shexp", 0),
        "norm_topk_prob": _NORM_TOPK.get(model_type, True) if norm is None else bool(norm),
        "mlp_only_layers": [i for i in layers if i not in sparse],
    }


def _gemma_config(file: GGUFFile, arch_name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """What llama.cpp derives for Gemma rather than reading: the attention scale (1/sqrt(head_dim),
    but hidden/heads for the 27B models: 46 layers of Gemma 2, 62 of Gemma 3), Gemma 3's local
    rotary base (10 000) and its one-global-in-six layer pattern; the soft caps are metadata."""
    key = file.arch_key
    is_27b = cfg["num_hidden_layers"] == (46 if arch_name == "gemma2" else 62)
    out: dict[str, Any] = {
        "query_pre_attn_scalar": cfg["hidden_size"] // cfg["num_attention_heads"] if is_27b else cfg["head_dim"],
        "attn_logit_softcapping": key("attn_logit_softcapping"),
        "final_logit_softcapping": key("final_logit_softcapping"),
    }
    if arch_name == "gemma3":
        out["rope_local_base_freq"] = 10000.0
        pattern = key("attention.sliding_window_pattern")
        if isinstance(pattern, list):  # one flag per layer: True where the layer slides
            out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        else:
            out["sliding_window_pattern"] = int(pattern or 6)
    return out


def _phi3_config(file: GGUFFile, cfg: dict[str, Any]) -> dict[str, Any]:
    """Phi-3's partial rotation (``rope.dimension_count``) and LongRoPE, whose factors llama.cpp
    stores as the tensors ``rope_factors_long``/``rope_factors_short``."""
    key = file.arch_key
    out: dict[str, Any] = {}
    rotary = key("rope.dimension_count")
    if rotary:
        out["partial_rotary_factor"] = int(rotary) / cfg["head_dim"]
    if file.has_tensor("rope_factors_long.weight"):
        rope: dict[str, Any] = {
            "rope_type": "longrope",
            "long_factor": file.float_tensor("rope_factors_long.weight").tolist(),
            "short_factor": file.float_tensor("rope_factors_short.weight").tolist(),
            "original_max_position_embeddings": int(
                key("rope.scaling.original_context_length") or cfg["max_position_embeddings"]
            ),
        }
        if key("rope.scaling.attn_factor") is not None:
            rope["attention_factor"] = float(key("rope.scaling.attn_factor"))
        out["rope_scaling"] = rope
    return out


def gguf_model_args(file: GGUFFile) -> tuple[ModelArgs, dict[str, Any]]:
    """:class:`ModelArgs` and the synthesised ``config.json`` of the file."""
    cfg = hf_config(file)
    try:
        return ModelArgs.from_hf(cfg, cfg["architectures"][0]), cfg
    except (KeyError, ValueError) as e:
        raise GGUFError(f"GGUF {cfg['architectures'][0]}: {e}") from None
