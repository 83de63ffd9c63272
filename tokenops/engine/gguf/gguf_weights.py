"""Build the engine's :class:`CausalLM` from a GGUF file with its weights left quantized.

The model is first built without weight memory (uninitialised, never-touched tensors on CPU;
the ``meta`` device elsewhere), its linear layers and token embedding are swapped for
:class:`QuantizedLinear` / :class:`QuantizedEmbedding` holding the file's blocks as they are,
and only the small float tensors (norms, biases) are filled. Resident weight memory is the
file's size plus those few float32 vectors.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tokenops.engine.gguf.gguf_experts import attach_experts
from tokenops.engine.gguf.gguf_quants import TRANSCODED_TO_Q8_0, dequantize, quant_type
from tokenops.engine.gguf.gguf_reader import GGUFError, GGUFFile, gguf_architecture, gguf_model_args
from tokenops.engine.gguf.gguf_transcode import Q8_0, transcode_rows
from tokenops.engine.kernels.quantized_linear import QuantizedEmbedding, QuantizedLinear, QuantizedWeight, pack_weights
from tokenops.engine.models.args import ModelArgs
from tokenops.engine.models.llama import CausalLM
from tokenops.engine.models.moe import SparseMoeBlock

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
# Gemma: HF's post_attention_layernorm follows attention; the MLP's input norm is ffn_norm
_SANDWICH_NORMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
# Phi-3: llama.cpp keeps Q|K|V and gate|up fused, in HF's order
_FUSED_LINEARS = {
    "self_attn.qkv_proj": ("attn_qkv",),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_up",),
    "mlp.down_proj": ("ffn_down",),
}


def load_gguf_model(path: Path, dtype: torch.dtype, device: torch.device) -> tuple[CausalLM, ModelArgs, dict[str, Any]]:
    """The model of the GGUF file ``path`` (eval mode, no grad), its args and config dict.

    Linear weights stay in their GGUF encodings; ``dtype`` is the activations' (and the
    norms') dtype. :raises GGUFError: for an architecture, tensor type or layout it cannot run.
    """
    file = GGUFFile(path)
    try:
        args, cfg = gguf_model_args(file)
        _, row = gguf_architecture(file)
        # On CPU the dense linear weights are created uninitialised (never touched, so never resident)
        # and replaced below; the meta device would cost ~50 MiB of torch's Python meta kernels.
        # On a GPU they would be real allocations: build on meta there.
        build_on = device if device.type == "cpu" else torch.device("meta")
        model = CausalLM(args, device=build_on, dtype=dtype)
        _attach_weights(model, file, args, row.permuted_qk, device, dtype)
        _materialise(model, device)  # what is left on meta (GPU): the norms and the rotary buffer
        _fill_floats(model, file)
        rope_freqs = file.float_tensor("rope_freqs.weight") if file.has_tensor("rope_freqs.weight") else None
        cfg["gguf"] = {"file": str(path), "file_bytes": file.num_bytes, "types": _type_counts(file)}
    finally:
        file.close()
    model.reset_buffers()
    if rope_freqs is not None:  # llama 3's frequency factors, stored as a tensor by llama.cpp
        model.inv_freq = model.inv_freq / torch.from_numpy(rope_freqs).to(model.inv_freq)
    model.eval().requires_grad_(False)
    pack_weights(model)  # into the kernels' row groups (the file's layout is released)
    _release_freed_heap()
    model.quantized_format = "gguf " + "/".join(f"{k}x{v}" for k, v in cfg["gguf"]["types"].items())
    return model, args, cfg


def _release_freed_heap() -> None:
    """Hand the loader's freed scratch memory (header parsing, the file's vocabulary as Python
    objects) back to the OS: glibc keeps freed heap pages otherwise, and they count in the RSS."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to do
            pass


def _type_counts(file: GGUFFile) -> dict[str, int]:
    """Tensors per type; a type held as Q8_0 is named ``Q5_0>Q8_0``."""
    from tokenops.engine.gguf.gguf_quants import QUANT_TYPES

    counts: dict[str, int] = {}
    for name in file.tensors:
        if len(file.tensors[name].shape) > 1:
            qt = QUANT_TYPES.get(file.tensor_type(name))
            label = qt.name if qt else str(file.tensor_type(name))
            label += ">Q8_0" if qt is not None and qt.ggml_type in TRANSCODED_TO_Q8_0 else ""
            counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))


def _stacked(
    file: GGUFFile,
    names: list[str],
    device: torch.device,
    permute_heads: list[int | None],
    rows: list[slice] | None = None,
) -> list[QuantizedWeight]:
    """The weights ``names`` (only ``rows[i]`` of each, when given: one expert of a 3-D tensor)
    stacked along their rows, one :class:`QuantizedWeight` per run of neighbours in the same
    encoding: each is copied once from the file mapping into its final buffer (no transient
    copies, which would stay in the allocator's heap and inflate the RSS)."""
    for name in names:
        if not file.has_tensor(name):
            raise GGUFError(f"GGUF file lacks tensor {name!r}")
    kept = [_kept_type(file, name) for name in names]  # a transcoded tensor joins its Q8_0 neighbours
    groups: list[list[int]] = []
    for i in range(len(names)):
        if groups and kept[groups[-1][-1]] == kept[i]:
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for group in groups:
        first = names[group[0]]
        columns = int(file.tensors[first].shape[0])
        views = [file.raw_view(names[i])[rows[i] if rows else slice(None)] for i in group]
        if len({int(file.tensors[names[i]].shape[0]) for i in group}) != 1:
            raise GGUFError(f"GGUF tensors {', '.join(names[i] for i in group)} differ in row length")
        row_bytes = quant_type(kept[group[0]], first).row_bytes(columns)
        raw = torch.empty((sum(v.shape[0] for v in views), row_bytes), dtype=torch.uint8, device=device)
        at = 0
        for i, view in zip(group, views):
            src = torch.from_numpy(view)  # copy-on-write mapping: read here, never written
            heads = permute_heads[i]
            if heads is not None:
                src = src.index_select(0, _unpermute_index(view.shape[0], heads))
            source = quant_type(file.tensor_type(names[i]), names[i])
            if source.ggml_type == kept[i]:
                raw[at : at + view.shape[0]].copy_(src)
            else:  # Q5_0, IQ4_NL, Q3_K...: decoded and re-encoded as Q8_0, a chunk of rows at a time
                transcode_rows(src, lambda rows, qt=source: dequantize(rows, qt), raw[at : at + view.shape[0]])
            at += view.shape[0]
        out.append(QuantizedWeight(raw, kept[group[0]], columns, first))
    return out


def _kept_type(file: GGUFFile, name: str) -> int:
    """The ggml type a tensor is held in: its own, or Q8_0 for the types read by transcoding."""
    ggml_type = int(quant_type(file.tensor_type(name), name).ggml_type)  # an unknown type: one line, here
    return Q8_0 if ggml_type in TRANSCODED_TO_Q8_0 else ggml_type


def _unpermute_index(rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's Q/K permutation (pairs interleaved per head) back to
    Hugging Face's rotary halves. A quantized row is self-contained, so rows move as bytes."""
    half = rows // num_heads // 2
    return torch.arange(rows).reshape(num_heads, half, 2).transpose(1, 2).reshape(-1)


def _attach_weights(
    model: CausalLM, file: GGUFFile, args: ModelArgs, permuted_qk: bool, device: torch.device, dtype: torch.dtype
) -> None:
    [embed] = _stacked(file, ["token_embd.weight"], device, [None])
    model.model.embed_tokens = QuantizedEmbedding(embed, dtype)  # type: ignore[assignment]
    if file.has_tensor("output.weight"):
        model.lm_head = QuantizedLinear(_stacked(file, ["output.weight"], device, [None]))  # type: ignore[assignment]
    else:  # tied: the output product reads the embedding's blocks
        model.lm_head = QuantizedLinear([embed])  # type: ignore[assignment]
    heads = {"attn_q": args.num_heads, "attn_k": args.num_kv_heads} if permuted_qk else {}
    linears = _FUSED_LINEARS if file.has_tensor("blk.0.attn_qkv.weight") else _LAYER_LINEARS
    for i, layer in enumerate(model.model.layers):
        if isinstance(layer.mlp, SparseMoeBlock):
            attach_experts(
                layer.mlp, file, i, lambda names, rows: _stacked(file, names, device, [None] * len(names), rows)
            )
        for ours, theirs in linears.items():
            if ours.startswith("mlp.") and isinstance(layer.mlp, SparseMoeBlock):
                continue
            names = [f"blk.{i}.{part}.weight" for part in theirs]
            parts = _stacked(file, names, device, [heads.get(part) for part in theirs])
            biases = [f"blk.{i}.{part}.bias" for part in theirs]
            present = [file.has_tensor(b) for b in biases]
            bias = None
            if any(present):
                if not all(present):
                    raise GGUFError(f"GGUF layer {i}: only some of {', '.join(theirs)} have a bias")
                bias = torch.cat([torch.from_numpy(file.float_tensor(b)) for b in biases]).to(device, dtype)
            holder, attr = _parent(layer, ours)
            expected = getattr(holder, attr)
            linear = QuantizedLinear(parts, bias)
            if (linear.out_features, linear.in_features) != (expected.out_features, expected.in_features):
                raise GGUFError(
                    f"GGUF layer {i} {ours}: shape {(linear.out_features, linear.in_features)} "
                    f"does not match the metadata's {(expected.out_features, expected.in_features)}"
                )
            setattr(holder, attr, linear)


def _materialise(model: nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer still on ``meta`` real (uninitialised) storage."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_meta:
                setattr(module, name, nn.Parameter(torch.empty_like(param, device=device), requires_grad=False))
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                module.register_buffer(
                    name,
                    torch.empty_like(buf, device=device),
                    persistent=name not in module._non_persistent_buffers_set,
                )


def _fill_floats(model: CausalLM, file: GGUFFile) -> None:
    """Copy the norms (float tensors) in; every one the model has must be in the file. llama.cpp's
    converter stores Gemma's norms as ``1 + weight``; the model adds the 1 itself, so it comes off."""
    offset = model.args.norm_offset

    def norm(name: str) -> torch.Tensor:
        return torch.from_numpy(file.float_tensor(name)) - offset

    with torch.no_grad():
        model.model.norm.weight.copy_(norm("output_norm.weight"))
        for i, layer in enumerate(model.model.layers):
            for ours, theirs in (_SANDWICH_NORMS if model.args.sandwich_norms else _LAYER_NORMS).items():
                holder, attr = _parent(layer, ours)
                module = getattr(holder, attr)
                if module is None:
                    continue
                name = f"blk.{i}.{theirs}.weight"
                if not file.has_tensor(name):
                    raise GGUFError(f"GGUF file lacks tensor {name!r}")
                module.weight.copy_(norm(name))


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
