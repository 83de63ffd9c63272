"""The C library behind the fused step (:mod:`tokenops.engine.kernels.fused_decode`), built once per panel
and KV dtype, and which models the step can run (:func:`ineligible_reason`): kept apart from the
decoder class so each file holds one concern."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from tokenops.engine.kernels import switches
from tokenops.engine.kernels.c_header import CSRC, bind, check_struct, read
from tokenops.engine.models.layers import Linear
from tokenops.engine.models.llama import CausalLM

log = logging.getLogger(__name__)


class QkWeight(ctypes.Structure):
    """``qk_weight`` of ``csrc/quant.h``: a GGUF-encoded weight as the fused step reads it (checked
    against the header when the library loads)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("rb", ctypes.c_int64),
        ("N", ctypes.c_int64),
        ("K", ctypes.c_int64),
        ("t", ctypes.c_int32),
        ("packed", ctypes.c_int32),
        ("next", ctypes.c_void_p),  # the weight's next part (another format, same K), or None
    ]


class LayerRecord(ctypes.Structure):
    """``tk_layer`` of ``csrc/fused_decode.h`` (checked against the header when the library loads)."""

    _fields_ = [
        (name, ctypes.c_void_p)
        for name in (
            "in_norm",
            "post_norm",
            "q_norm",
            "k_norm",
            "pre_ff_norm",
            "post_ff_norm",
            "wqkv",
            "bqkv",
            "wo",
            "bo",
            "wgu",
            "bgu",
            "wd",
            "bd",
            "kc",
            "vc",
        )
    ] + [("window", ctypes.c_int64), ("rope_off", ctypes.c_int64)]


class ModelRecord(ctypes.Structure):
    """``tk_model`` of ``csrc/fused_decode.h``: what the Gemma family adds to the Llama block, model wide."""

    _fields_ = [
        ("embed_scale", ctypes.c_float),
        ("attn_softcap", ctypes.c_float),
        ("final_softcap", ctypes.c_float),
        ("gelu", ctypes.c_int32),
    ]


#: the gated MLP's activations the step computes: SiLU, and GELU's tanh approximation (Gemma)
ACTIVATIONS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1, "gelu_new": 1}


def model_record(model: CausalLM) -> ModelRecord:
    """The step's ``tk_model`` for ``model`` (for a Llama-shaped model: scale 1, no caps, SiLU)."""
    args = model.args
    return ModelRecord(
        float(args.embed_scale),
        float(args.attn_softcap or 0.0),
        float(args.final_softcap or 0.0),
        ACTIVATIONS[args.hidden_act],
    )


def norm_scale(norm: torch.nn.Module | None, offset: float) -> torch.Tensor | None:
    """What the step multiplies a norm's output by: its weight, or Gemma's ``offset + weight`` computed
    once (in float32, as the PyTorch forward computes it every step)."""
    if norm is None:
        return None
    weight = norm.weight
    assert isinstance(weight, torch.Tensor)
    weight = weight.detach()
    return weight if not offset else (offset + weight.float()).contiguous()


def layer_records(model: CausalLM, ptr: Any, kv_cache: torch.Tensor) -> Any:
    """The C step's per-layer records: norms, products (+ biases), the layer's cache, its window (the rotary
    table offsets are set by the decoder as its tables grow). ``ptr(t)``: where the step reads ``t``."""
    args = model.args
    layers = (LayerRecord * args.num_layers)()
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.dense_mlp
        norms = [layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm]
        if layer.is_sandwich:
            norms += [layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm]
        else:
            norms += [None, None]
        layers[i] = LayerRecord(
            *(ptr(norm_scale(n, args.norm_offset)) for n in norms),
            ptr(weight_of(attn.qkv_proj)),
            ptr(attn.qkv_proj.bias),
            ptr(weight_of(attn.o_proj)),
            ptr(attn.o_proj.bias),
            ptr(weight_of(mlp.gate_up_proj)),
            ptr(mlp.gate_up_proj.bias),
            ptr(weight_of(mlp.down_proj)),
            ptr(mlp.down_proj.bias),
            kv_cache[0, i].data_ptr(),
            kv_cache[1, i].data_ptr(),
            int(attn.window or 0),
            0,
        )
    return layers


#: panel dtype -> the build's defines and the library's name
_VARIANTS: dict[str, tuple[list[str], str]] = {
    "float32": ([], "fused_decode"),
    "bfloat16": (["TK_PANEL_BF16=1"], "fused_decode_bf16"),
    "gguf": (["TK_QUANT=1"], "fused_decode_gguf"),  # the products from GGUF blocks (quant.c built in)
}
#: where the sources are built from (a benchmark points it at a patched copy)
FOLDER = CSRC
_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL | None] = {}  # panel dtype (+ "-kvbf16", + cpu_isa) -> library (None: could not be built)


def library(panel_dtype: str = "float32", kv_bf16: bool = False) -> ctypes.CDLL | None:
    isa = switches.current.cpu_isa
    key = panel_dtype + ("-kvbf16" if kv_bf16 else "") + ("" if isa == "native" else "-" + isa)
    if key in _libs:
        return _libs[key]
    with _lock:
        if key not in _libs:
            import subprocess

            from tokenops.engine.kernels.native import build_library

            defines, stem = _VARIANTS[panel_dtype]
            if kv_bf16:
                defines, stem = [*defines, "TK_KV_BF16=1"], stem + "_kvbf16"
            lib = None
            try:
                check_struct(LayerRecord, "tk_layer", "fused_decode.h")
                check_struct(ModelRecord, "tk_model", "fused_decode.h")
                check_struct(QkWeight, "qk_weight", "quant.h")
                lib = bind(
                    ctypes.CDLL(
                        str(build_library(main="fused_decode.c", stem=stem, defines=defines, folder=FOLDER, isa=isa))
                    ),
                    read("fused_decode.h"),
                )
                if panel_dtype == "gguf":  # the quantized kernels are built in: their switches too
                    switches.register(bind(lib, read("quant.h")))
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                log.warning("fused decode step unavailable, decodes use the PyTorch path: %s", e)
                lib = None
            _libs[key] = lib
    return _libs[key]


def ineligible_reason(model: torch.nn.Module, kv_cache: torch.Tensor, device: torch.device) -> str | None:
    """Why ``model`` cannot use the fused decode step, or None when it can."""
    from tokenops.engine.kernels.native import disabled

    if disabled():
        return "native kernels are disabled (TOKENOPS_NATIVE_ATTENTION=0, native_kernels)"
    if device.type != "cpu":
        return "it is for CPU"
    if not isinstance(model, CausalLM):
        return "the model was replaced by a transform"
    args = model.args
    if args.is_moe:
        return "the model has mixture-of-experts layers"
    if kv_cache.dtype not in (torch.float32, torch.bfloat16):
        return "it needs a float32 or bfloat16 KV cache"
    if args.hidden_act not in ACTIVATIONS:
        return f"activation {args.hidden_act!r} (only SiLU and GELU's tanh approximation)"
    layers = [
        m
        for layer in model.model.layers
        for m in (
            layer.self_attn.qkv_proj,
            layer.self_attn.o_proj,
            layer.dense_mlp.gate_up_proj,
            layer.dense_mlp.down_proj,
        )
    ]
    if is_quantized(model):
        why = _quantized_reason(model, layers + [model.lm_head])
        if why is not None:
            return why
    else:
        for module in layers + [model.lm_head]:
            if type(module) is not Linear:
                return f"a weight transform replaced a linear layer ({type(module).__name__})"
    if any(param.dtype != torch.float32 for param in model.parameters()):
        return "it needs float32 weights"
    if args.num_heads % args.num_kv_heads:
        return "query heads are not a multiple of KV heads"
    # what the C step does not compute (Phi-3 variants): such models keep the PyTorch forward. Gemma's
    # norms, embedding scale, sandwich norms, soft caps, attention scale and local rotary table it does.
    if args.rotary_dim != args.head_dim:
        return "partial rotary embeddings"
    specs = [args.rope_spec()] + ([args.rope_spec(local=True)] if args.local_rope_theta is not None else [])
    if any(spec.attention_factor() != 1.0 or spec.is_longrope for spec in specs):
        return "LongRoPE rotary tables"
    return None


def is_quantized(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds GGUF-encoded weights (a GGUF file's model): the fused step then runs
    its products through the quantized kernels (:mod:`tokenops.engine.kernels.quant_kernels`)."""
    from tokenops.engine.kernels.quantized_linear import QuantizedLinear

    return isinstance(getattr(model, "lm_head", None), QuantizedLinear)


def _quantized_reason(model: CausalLM, linears: Sequence[torch.nn.Module]) -> str | None:
    from tokenops.engine.kernels import quant_kernels
    from tokenops.engine.kernels.quantized_linear import QuantizedEmbedding, QuantizedLinear

    kernels = quant_kernels.get_kernels()
    if kernels is None or not kernels.has_avx2:
        return "the quantized kernels need AVX2 and a C compiler"
    if quant_kernels.exact():
        return "TOKENOPS_QUANT_EXACT (quant_exact) asks for float32 activations"
    embed = model.model.embed_tokens
    if not isinstance(embed, QuantizedEmbedding) or embed.dtype != torch.float32:
        return "its embedding is not quantized"
    for module in [*linears, embed]:
        weights = [embed.weight_q] if module is embed else list(getattr(module, "parts", []))
        if not isinstance(module, (QuantizedLinear, QuantizedEmbedding)) or not weights:
            return f"a layer is not quantized ({type(module).__name__})"
        for weight in weights:  # a layer of parts in several encodings (q/k/v) chains their qk_weights
            if weight.ggml_type not in quant_kernels.SUPPORTED:
                return f"no kernel for {weight.qtype.name} weights"
    return None


def weight_of(linear: torch.nn.Module) -> Any:
    """What the fused step multiplies by: a Linear's weight, a QuantizedLinear's one QuantizedWeight (its
    parts, a QuantizedWeights, when it has several: the step chains their qk_weight records)."""
    parts = getattr(linear, "parts", None)
    return (parts[0] if len(parts) == 1 else parts) if parts is not None else linear.weight


def dense_linear_bytes(model: torch.nn.Module) -> int:
    """Bytes of the float32 linear weights (what the decoder holds a copy of)."""
    return sum(m.weight.numel() * 4 for m in model.modules() if type(m) is Linear)
