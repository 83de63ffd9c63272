"""Loads the model, owns the paged KV cache and runs one forward per engine step.

This is the only engine module that knows about devices: everything above it
(scheduler, block manager) deals in token ids and block ids.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.core.tokenizer import Tokenizer
from tokenops.engine.gguf.gguf_reader import reusing_headers
from tokenops.engine.kernels import switches
from tokenops.engine.kernels.attention import AttentionMetadata
from tokenops.engine.kernels.fused_decode import make_fused_decoder
from tokenops.engine.kernels.panels import PanelDtypeUnavailable, hugepage_arena
from tokenops.engine.kernels.weight_layout import pack_linear_weights
from tokenops.engine.lora.lora_adapters import AdapterError, LoraAdapter, LoraSet, load_adapter
from tokenops.engine.lora.lora_native import NativeLora
from tokenops.engine.models.loader import load_model, load_tokenizer, parse_dtype, resolve_model_dir

if TYPE_CHECKING:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.protocols import ModelCompiler, ModelTransform


def apply_transforms(model: torch.nn.Module, config: Any, transforms: Sequence[ModelTransform]) -> torch.nn.Module:
    """Run each weight transform (quantization, pruning...) in order; None keeps the model."""
    for transform in transforms:
        replacement = transform(model, config)
        if replacement is not None:
            model = replacement
    return model


def pick_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available; use device = 'cpu' or 'auto'")
    return device


class ModelRunner:
    """Runs the model over a paged KV cache.

    Attributes: ``tokenizer``, ``model_name``, ``max_model_len``, ``num_blocks``,
    ``block_size``, ``vocab_size``, ``is_moe``, ``device``, ``hf_config``, ``model_dir``,
    ``load_time_s``.

    ``transforms`` run on the loaded model in order, then ``compile``, then its linear weights are
    packed (plain for a compiled forward); the engine passes them from its :class:`~tokenops.engine.core.policies.EnginePolicies`.
    """

    def __init__(
        self, config: EngineConfig, transforms: Sequence[ModelTransform] = (), compile: ModelCompiler | None = None
    ) -> None:
        start = time.perf_counter()
        self.config = config
        #: the kernel switches of this runner's config: applied before any kernel loads or packs a weight,
        #: and again by a step that finds another runner's in force (they are process-wide)
        self.switches = switches.KernelSwitches.of(config)
        switches.apply(self.switches)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.device = pick_device(config.device)
        self.dtype = parse_dtype(config.dtype)
        self.model_dir = resolve_model_dir(config.model, getattr(config, "allow_download", False))
        self.model_name = config.model_name or _served_name(config.model)
        with reusing_headers():  # a GGUF file's header read once for the weights and the tokenizer
            raw_model, self.args, self.hf_config = load_model(self.model_dir, self.dtype, self.device)
            self.tokenizer: Tokenizer = load_tokenizer(self.model_dir)
        #: e.g. "gguf Q4_1x210/Q8_0x1" when the weights stay quantized (the PyTorch forward runs them), else None
        self.weight_format: str | None = getattr(raw_model, "quantized_format", None)
        self.vocab_size = self.args.vocab_size
        self.is_moe = self.args.is_moe
        self.block_size = config.block_size
        self.num_blocks = config.kv_cache_tokens // config.block_size
        if self.num_blocks < 1:
            raise ValueError(
                f"kv_cache_tokens {config.kv_cache_tokens} is smaller than one block ({config.block_size})"
            )
        max_pos = self.args.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > max_pos:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the model's max_position_embeddings {max_pos}"
            )
        self.max_model_len = min(config.max_model_len or max_pos, self.num_blocks * self.block_size)
        self._raw_model = raw_model  # the module whose layers hold the cache views and counters
        self.windows = raw_model.attention_windows
        self._allocate_kv_cache()
        self.kv_offload = self._make_offload_store()
        self.native_attention = self._pick_attention_kernel()
        self._prepare_forward(apply_transforms(raw_model, config, transforms), compile)
        self.load_time_s = time.perf_counter() - start

    def _prepare_forward(self, model: torch.nn.Module, compile: ModelCompiler | None) -> None:
        """The fused step, the (compiled) forward and its packed linear weights, and the LoRA set, for the
        transformed ``model``."""
        config = self.config
        #: Engine steps of up to 2048 tokens (decodes, prefill and verify chunks) in one native call (fused_decode.py);
        #: built before packing, which releases the dense weights it copies.
        self.fused_decode = make_fused_decoder(
            model,
            self.kv_cache,
            self.block_size,
            self.device,
            getattr(config, "decode_kernel", "auto"),
            getattr(config, "panel_dtype", "float32"),
        )
        self.num_fused_steps = 0
        #: "panels" when the linear layers multiply through the fused step's copy of their weights, "onednn"
        #: through prepacked oneDNN weights, else "plain" (see weight_layout.py). A compiled forward keeps
        #: to torch operators (no panels, and no oneDNN packing under "auto": inductor cannot lower
        #: mkldnn._linear_pointwise on a prepacked weight, so every request of a compiled fp32 model
        #: failed). torch.compile is lazy (it traces at the first forward), so compiling first is safe.
        compiled = compile(model) if compile is not None else None
        layout = getattr(config, "weight_layout", "auto")
        self.weight_layout = pack_linear_weights(
            model,
            self.device,
            self.dtype,
            "plain" if compiled is not None and layout == "auto" else layout,
            panels=self.fused_decode if compiled is None else None,
        )
        #: LoRA adapters served on this model (tokenops/engine/lora/lora_adapters.py); hooked on the transformed model
        self.lora = LoraSet(model, self.args)
        self._lora_dtype = torch.bfloat16 if self.dtype == torch.bfloat16 else torch.float32
        self._native_lora: NativeLora | None = None
        self.model = model if compiled is None else compiled
        #: what the stats show: the weights' encoding (a GGUF's quant types, a transform's
        #: ``weight_encoding`` such as int8 weight-only, else the dtype) and whether the forward is compiled
        self.weight_encoding: str = (
            self.weight_format or getattr(model, "weight_encoding", None) or str(self.dtype).removeprefix("torch.")
        )
        self.is_compiled = compiled is not None
        if compiled is not None and self.fused_decode is not None:  # a compiled forward is the user's choice
            if getattr(config, "decode_kernel", "auto") == "native":
                raise ValueError("engine decode_kernel 'native' is unavailable: the model's forward is compiled")
            self.fused_decode = None
        panel_dtype = getattr(config, "panel_dtype", "float32")
        if panel_dtype != "float32" and self.fused_decode is None:
            raise PanelDtypeUnavailable(
                f"engine panel_dtype {panel_dtype!r} is unavailable: it is the fused decode step's weights, and "
                "that step is off for this model (decode_kernel, a model it cannot run or a compiled forward; "
                "see the log)"
            )

    def _allocate_kv_cache(self) -> None:
        args = self.args
        # One tensor for all layers so copy_block is a single copy.
        shape = (2, args.num_layers, self.num_blocks, self.block_size, args.num_kv_heads, args.head_dim)
        #: int8 KV cache (kv_cache_dtype = "int8"): values plus per-token-per-head float32 scales.
        self.kv_scales: torch.Tensor | None = None
        kv_dtype = getattr(self.config, "kv_cache_dtype", "auto")
        # "bfloat16": half the bytes of a float32 model's cache; written rounded, read as float32
        dtype = torch.bfloat16 if kv_dtype == "bfloat16" else self.dtype
        if kv_dtype == "int8":
            self.kv_cache = torch.zeros(shape, dtype=torch.int8, device=self.device)
            self.kv_scales = torch.zeros(shape[:-1], dtype=torch.float32, device=self.device)
        elif self.device.type == "cpu":
            # on huge pages, like the fused step's weights: a decode step streams the whole context's
            # K/V (a 48-row step of the llama.cpp benchmark ~200 MB), a TLB miss every 4 KiB otherwise
            self._kv_buf, flat = hugepage_arena(math.prod(shape), dtype)
            self.kv_cache = flat.view(shape)
        else:
            self.kv_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        for i, attn in enumerate(self._raw_model.attention_layers()):
            scales = None if self.kv_scales is None else (self.kv_scales[0, i], self.kv_scales[1, i])
            attn.bind_cache(self.kv_cache[0, i], self.kv_cache[1, i], scales)

    def _make_offload_store(self):
        """The KV offload tier's host/disk storage (None when the tier is off)."""
        config = self.config
        host_blocks, host_mb = getattr(config, "kv_offload_host_blocks", 0), getattr(config, "kv_offload_host_mb", 0.0)
        if not (host_blocks or host_mb):
            return None
        from tokenops.engine.kv.offload_store import OffloadStore, block_bytes

        size = block_bytes(self.kv_cache, self.kv_scales)
        disk_blocks = config.kv_offload_disk_blocks or int(config.kv_offload_disk_mb * 2**20 // size)
        num_host = host_blocks or int(host_mb * 2**20 // size)
        if num_host < 1:
            raise ValueError(
                f"engine kv_offload_host_mb {host_mb} is smaller than one KV block ({size / 2**20:.3f} MB)"
            )
        return OffloadStore(self.kv_cache, self.kv_scales, num_host, disk_blocks, config.kv_offload_disk_path)

    def transfer_kv(self, ops: list) -> None:
        """Run the block manager's offload-tier copies (in order) before the forward."""
        assert self.kv_offload is not None, "KV transfers without an offload tier"
        self.kv_offload.execute(ops)

    def _pick_attention_kernel(self):
        """The compiled paged decode kernel (see :mod:`tokenops.engine.kernels.native`), or None for
        the PyTorch path (``attention_backend = "torch"``, an int8 cache, a GPU, fp16, or
        soft-capped attention scores, which the kernel does not compute)."""
        backend = getattr(self.config, "attention_backend", "auto")
        if backend == "torch":
            return None
        if self.args.attn_softcap is not None:
            if backend == "native":
                raise ValueError(
                    "engine attention_backend 'native' is unavailable: the model soft-caps attention scores (Gemma 2)"
                )
            return None
        from tokenops.engine.kernels.native import PagedDecodeKernel, get_kernel

        usable = (
            self.kv_scales is None and self.device.type == "cpu" and self.kv_cache.dtype in PagedDecodeKernel.DTYPES
        )
        kernel = get_kernel() if usable else None
        if backend == "native" and kernel is None:
            why = "it could not be built (see the log)" if usable else "it needs a float32 or bfloat16 KV cache on CPU"
            raise ValueError(f"engine attention_backend 'native' is unavailable: {why}")
        return kernel

    @property
    def kv_cache_bytes(self) -> int:
        num = self.kv_cache.numel() * self.kv_cache.element_size()
        if self.kv_scales is not None:
            num += self.kv_scales.numel() * self.kv_scales.element_size()
        return num

    @torch.inference_mode()
    def execute(self, chunks: list[ChunkInput]) -> torch.Tensor:
        """One forward over all ``chunks``; float32 logits ``[len(chunks), vocab]`` of
        each chunk's last token, in the order given (on the runner's device).

        A chunk with ``num_logits = m > 1`` contributes the rows of its last ``m``
        tokens instead (in position order), so the result has ``sum(num_logits)`` rows."""
        if switches.current != self.switches:  # another runner's (models of one server should share them)
            switches.apply(self.switches)
        if not chunks:
            return torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        for c in chunks:
            if c.end_pos > self.max_model_len:
                raise ValueError(f"sequence of {c.end_pos} tokens exceeds max_model_len {self.max_model_len}")
        has_lora = any(c.lora is not None for c in chunks)
        if self.fused_decode is not None and self.fused_decode.accepts(chunks):
            self.num_fused_steps += 1
            return self._fused_lora_step(chunks) if has_lora else self.fused_decode(chunks)
        # Decodes go first, longest context first, so the attention layer can batch them
        # as contiguous slices of similar length.
        order = sorted(range(len(chunks)), key=lambda i: (not chunks[i].is_decode, -chunks[i].end_pos))
        ordered = [chunks[i] for i in order]
        token_ids: list[int] = []
        positions: list[int] = []
        last_rows: list[list[int]] = [[] for _ in chunks]
        for i, c in zip(order, ordered):
            token_ids.extend(c.token_ids)
            positions.extend(range(c.start_pos, c.end_pos))
            last_rows[i] = list(range(len(token_ids) - c.num_logits, len(token_ids)))
        device = self.device
        meta = AttentionMetadata.build(
            ordered, self.block_size, device, self.windows, self.dtype, native=self.native_attention
        )
        input_ids = torch.tensor(token_ids, dtype=torch.long, device=device)
        pos = torch.tensor(positions, dtype=torch.long, device=device)
        logits_index = torch.tensor([r for rows in last_rows for r in rows], dtype=torch.long, device=device)
        if not has_lora:
            return self.model(input_ids, pos, meta, logits_index)
        self.lora.begin_step([c.lora for c in ordered for _ in c.token_ids], device)
        try:
            return self.model(input_ids, pos, meta, logits_index)
        finally:
            self.lora.end_step()

    def _fused_lora_step(self, chunks: list[ChunkInput]) -> torch.Tensor:
        """The fused step over chunks with adapter rows (lora_native.py); logits in ``chunks``' order."""
        self.lora.count_step([c.lora for c in chunks], fused=True)
        assert self.fused_decode is not None  # execute() checked it
        return self.fused_decode(chunks, self._lora_native.step(chunks, self.lora.adapters))

    @property
    def _lora_native(self) -> NativeLora:
        """The fused step's view of the adapters (float32 on CPU, as the fused step's model)."""
        if self._native_lora is None:
            self._native_lora = NativeLora(self.args.num_layers)
        return self._native_lora

    def prepare_lora(self, name: str, path: str | Path, check_base: bool = True) -> LoraAdapter:
        """Read and validate the PEFT adapter folder ``path`` as ``name``, changing nothing (the
        slow part of a load, safe beside a running step); :meth:`LoraSet.add` then serves it."""
        if name in self.lora:
            raise AdapterError(f"LoRA adapter {name!r} is already loaded")
        if name == self.model_name:
            raise AdapterError(f"LoRA adapter name {name!r} is the base model's name")
        served = [self.model_name, Path(str(self.model_dir)).stem, Path(str(self.model_dir)).name]
        return load_adapter(name, path, self.args, served, self._lora_dtype, self.device, check_base)

    def load_lora(self, name: str, path: str | Path, check_base: bool = True) -> LoraAdapter:
        """:meth:`prepare_lora` and add it (an :class:`AdapterError` leaves the loaded set unchanged)."""
        adapter = self.prepare_lora(name, path, check_base)
        self.lora.add(adapter)
        return adapter

    def unload_lora(self, name: str) -> LoraAdapter:
        if name not in self.lora:
            raise AdapterError(f"LoRA adapter {name!r} is not loaded")
        return self.lora.remove(name)

    @torch.inference_mode()
    def copy_block(self, src: int, dst: int) -> None:
        """Copy one KV block in every layer (copy-on-write when sequences fork)."""
        assert 0 <= src < self.num_blocks and 0 <= dst < self.num_blocks, (src, dst)
        self.kv_cache[:, :, dst].copy_(self.kv_cache[:, :, src])
        if self.kv_scales is not None:
            self.kv_scales[:, :, dst].copy_(self.kv_scales[:, :, src])

    def expert_load(self) -> list[list[int]] | None:
        """Cumulative routed tokens per ``[layer][expert]`` (dense layers of a MoE model
        are all zeros); None for dense models."""
        if not self.is_moe:
            return None
        blocks = self._raw_model.moe_blocks()
        num_experts = self.args.num_experts
        return [b.expert_counts.tolist() if b is not None else [0] * num_experts for b in blocks]

    def reset_expert_load(self) -> None:
        for block in self._raw_model.moe_blocks():
            if block is not None:
                block.expert_counts.zero_()


def _served_name(model: str | None) -> str:
    if model is None:
        from tokenops.engine.models.default_model import default_model_name

        return default_model_name()
    # A local folder is served under its name; a hub id as written (org/name).
    path = Path(model).expanduser()
    if path.is_file():  # a GGUF file: its name without the extension
        return path.resolve().stem
    return path.resolve().name if path.is_dir() else model
