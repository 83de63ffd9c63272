"""Build the engine's :class:`CausalLM` from a GGUF file with its weights left quantized.

The model is first built on the ``meta`` device (no memory), its linear layers and token
embedding are swapped for :class:`QuantizedLinear` / :class:`QuantizedEmbedding` holding the
file's blocks as they are, and only the small float tensors (norms, biases) are materialised.
Resident weight memory is the file's size plus those few float32 vectors.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tokenops.engine.gguf_reader import GGUFError, GGUFFile, gguf_architecture, gguf_model_args
from tokenops.engine.models.args import ModelArgs
from tokenops.engine.models.llama import CausalLM
from tokenops.engine.quantized_linear import (QuantizedEmbedding, QuantizedLinear, QuantizedWeight, pack_weights,
                                              stack_parts)

log = logging.getLogger(__name__)

# our module (inside a layer) -> the GGUF tensors stacked into it, in output order
_LAYER_LINEARS = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}
_LAYER_NORMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}


def load_gguf_model(path: Path, dtype: torch.dtype, device: torch.device) -> tuple[CausalLM, ModelArgs, dict[str, Any]]:
    """The model of the GGUF file ``path`` (eval mode, no grad), its args and config dict.

    Linear weights stay in their GGUF encodings; ``dtype`` is the activations' (and the
    norms') dtype. :raises GGUFError: for an architecture, tensor type or layout it cannot run.
    """
    file = GGUFFile(path)
    try:
        args, cfg = gguf_model_args(file)
        if args.is_moe:
            raise GGUFError("GGUF mixture-of-experts models are not supported yet")
        _, row = gguf_architecture(file)
        with torch.device("meta"):
            model = CausalLM(args, dtype=dtype)
        _attach_weights(model, file, args, row.permuted_qk, device, dtype)
        _materialise(model, device)  # what is left on meta: the norms and the rotary buffer
        _fill_floats(model, file)
        rope_freqs = file.float_tensor("rope_freqs.weight") if file.has_tensor("rope_freqs.weight") else None
        cfg["gguf"] = {"file": str(path), "file_bytes": file.num_bytes, "types": _type_counts(file)}
    finally:
        file.close()
    model.reset_buffers()
    if rope_freqs is not None:  # llama 3's frequency factors, stored as a tensor by llama.cpp
        model.inv_freq = model.inv_freq / torch.from_numpy(rope_freqs).to(model.inv_freq)
    model.eval().requires_grad_(False)
    pack_weights(model)
    model.quantized_format = "gguf " + "/".join(f"{k}x{v}" for k, v in cfg["gguf"]["types"].items())
    return model, args, cfg


def _type_counts(file: GGUFFile) -> dict[str, int]:
    from tokenops.engine.gguf_quants import QUANT_TYPES

    counts: dict[str, int] = {}
    for name in file.tensors:
        if len(file.tensors[name].shape) > 1:
            qt = QUANT_TYPES.get(file.tensor_type(name))
            label = qt.name if qt else str(file.tensor_type(name))
            counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))


def _quantized(file: GGUFFile, name: str, device: torch.device, permute_heads: int | None = None) -> QuantizedWeight:
    if not file.has_tensor(name):
        raise GGUFError(f"GGUF file lacks tensor {name!r}")
    t = file.tensors[name]
    in_features = int(t.shape[0])
    raw = torch.from_numpy(file.raw_rows(name))
    if permute_heads is not None:
        raw = _unpermute_rows(raw, permute_heads)
    return QuantizedWeight(raw.to(device), file.tensor_type(name), in_features, name)


def _unpermute_rows(raw: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order (pairs interleaved per head) back to Hugging Face's halves.

    Rows are output features; a quantized row is self-contained, so rows move as byte strings."""
    rows = raw.shape[0]
    half = rows // num_heads // 2
    index = torch.arange(rows).reshape(num_heads, half, 2).transpose(1, 2).reshape(-1)
    return raw.index_select(0, index)


def _attach_weights(model: CausalLM, file: GGUFFile, args: ModelArgs, permuted_qk: bool, device: torch.device,
                    dtype: torch.dtype) -> None:
    embed = _quantized(file, "token_embd.weight", device)
    model.model.embed_tokens = QuantizedEmbedding(embed, dtype)  # type: ignore[assignment]
    if file.has_tensor("output.weight"):
        model.lm_head = QuantizedLinear([_quantized(file, "output.weight", device)])  # type: ignore[assignment]
    else:  # tied: the output product reads the embedding's blocks
        model.lm_head = QuantizedLinear([embed])  # type: ignore[assignment]
    for i, layer in enumerate(model.model.layers):
        for ours, theirs in _LAYER_LINEARS.items():
            parts = []
            biases = []
            for part in theirs:
                heads = None
                if permuted_qk and part == "attn_q":
                    heads = args.num_heads
                elif permuted_qk and part == "attn_k":
                    heads = args.num_kv_heads
                parts.append(_quantized(file, f"blk.{i}.{part}.weight", device, heads))
                bias_name = f"blk.{i}.{part}.bias"
                biases.append(bias_name if file.has_tensor(bias_name) else None)
            bias = None
            if any(biases):
                if not all(biases):
                    raise GGUFError(f"GGUF layer {i}: only some of {', '.join(theirs)} have a bias")
                bias = torch.cat([torch.from_numpy(file.float_tensor(b)) for b in biases]).to(device, dtype)
            holder, attr = _parent(layer, ours)
            expected = getattr(holder, attr)
            linear = QuantizedLinear(stack_parts(parts), bias)
            if (linear.out_features, linear.in_features) != (expected.out_features, expected.in_features):
                raise GGUFError(f"GGUF layer {i} {ours}: shape {(linear.out_features, linear.in_features)} "
                                f"does not match the metadata's {(expected.out_features, expected.in_features)}")
            setattr(holder, attr, linear)


def _materialise(model: nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer still on ``meta`` real (uninitialised) storage."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_meta:
                setattr(module, name, nn.Parameter(torch.empty_like(param, device=device), requires_grad=False))
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                module.register_buffer(name, torch.empty_like(buf, device=device),
                                       persistent=name not in module._non_persistent_buffers_set)


def _fill_floats(model: CausalLM, file: GGUFFile) -> None:
    """Copy the norms (float tensors) in; every one the model has must be in the file."""
    with torch.no_grad():
        model.model.norm.weight.copy_(torch.from_numpy(file.float_tensor("output_norm.weight")))
        for i, layer in enumerate(model.model.layers):
            for ours, theirs in _LAYER_NORMS.items():
                holder, attr = _parent(layer, ours)
                module = getattr(holder, attr)
                if module is None:
                    continue
                name = f"blk.{i}.{theirs}.weight"
                if not file.has_tensor(name):
                    raise GGUFError(f"GGUF file lacks tensor {name!r}")
                module.weight.copy_(torch.from_numpy(file.float_tensor(name)))


def _parent(root: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    *path, attr = dotted.split(".")
    for part in path:
        root = getattr(root, part)
    return root, attr


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer (quantized blocks included), counting shared ones once."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen and t.device.type != "meta":
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total
