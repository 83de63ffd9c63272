"""A whole decode step in one native call, for the decode steps of any batch size.

A decode step on CPU does little arithmetic per weight at small batches (bound by memory
bandwidth) and, through PyTorch, makes ~15 operator calls per layer (norms, rotary, cache write,
attention, activation, residuals), each with dispatch costs of a few microseconds
(``docs/engine-optimizations.md``).

:class:`FusedDecoder` runs a step's rows (one per token of every chunk: decodes, prefill chunks,
speculative decoding's verify chunks, a draft's catch-up chunks; at most
:attr:`FusedDecoder.max_rows` rows) through all layers of a float32 Llama-family model in
ONE call into a small C library compiled like the paged attention kernel
(:mod:`tokenops.engine.kernels.native`): embedding lookup, RMSNorm, the fused QKV product (+ bias),
Qwen3's q/k norms, rotary embedding (from the same cos/sin table the PyTorch path computes),
the cache write, paged attention with grouped-query heads, sliding windows and evicted
blocks, the output projection with the residual added in place, the gated SiLU MLP, and the
final norm and vocabulary projection, inside one OpenMP parallel region.

Products read the linear weights packed in panels of 16 output features (``[N/16][K][16]``):
AVX2 register tiles of R input rows x 6 / R panels (twelve accumulators from 1 to 6 rows)
broadcast each input element once against 8-wide loads of the panels, and each group of panels
is read from memory once while every row passes over it, so the same code is a matrix-vector
product at batch 1, a verify chunk's product at 7 rows and a GEMM at 48 rows (faster than oneDNN
at these shapes). Every output is one FMA chain down K, so a row's logits do not depend on the
rows beside it. The panels hold float32, or bfloat16 (``panel_dtype``: half the bytes, the
weights rounded; a speculative draft's default). A draft model's greedy proposals run as
consecutive steps in one call (:meth:`FusedDecoder.draft_greedy`). Threads take panels (and
attention units) dynamically: a thread that the event loop preempts does not hold up half of
every product. Attention splits each sequence's
context between the threads (each streams its own stretch of the cache, reading every K and V
row once for all heads and all rows of its chunk) and merges the partial softmaxes; a long chunk
(a prefill) is split between the threads by rows instead, in parts of equal work. Only the rows
whose logits are wanted (a prefill chunk's last) go through the final norm and the vocabulary
projection.

The decoder packs its copy of the linear weights at load into one arena, 2 MiB aligned and
advised onto transparent huge pages. ``[engine] weight_layout = "auto"`` then makes the PyTorch
forward's linear layers (steps over max_rows) multiply through the same panels (:class:`PanelWeight`)
and releases their dense weights, so the weights are held once; with ``weight_layout = "onednn"``
or ``"plain"`` they are held twice. ``[engine] decode_kernel = "auto"`` uses the decoder only
while that copy stays under :data:`AUTO_MAX_EXTRA_BYTES` (the load briefly holds both);
``"native"`` always (or an error when the model is not eligible), ``"torch"`` never. Steps of
more than ``max_rows`` tokens (a token budget over :data:`MAX_ROWS`) take the PyTorch path, which
stays the reference: greedy output is the same either way in the tests, and logits and K/V agree
to float32 rounding (the sums run in another order).

Eligible: a dense (not MoE) model in float32 on CPU, SiLU or GELU-tanh MLP, float32 or bfloat16 KV
cache, no weight transform (quantized layers) and no compiled forward (the runner drops the decoder
when a compile plugin returns a model). Gemma 1/2/3 take it (``tk_model`` and the layer records carry
their additions: scaled embeddings, ``1 + w`` norms folded at setup, sandwich norms, GELU, soft caps,
a second rotary table for Gemma 3's local layers); Phi-3's partial rotation and LongRoPE do not.
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, Any

import torch

from tokenops.engine.kernels import fused_library
from tokenops.engine.kernels.fused_library import QkWeight, ineligible_reason, is_quantized, layer_records
from tokenops.engine.kernels.fused_library import library as _library
from tokenops.engine.kernels.fused_library import weight_of as _weight
from tokenops.engine.kernels.panels import PANEL_DTYPES, PanelWeight, pack_arena
from tokenops.engine.models.layers import Linear, rope_cos_sin
from tokenops.engine.models.llama import CausalLM

if TYPE_CHECKING:
    from tokenops.engine.core.batch import ChunkInput

log = logging.getLogger(__name__)

DECODE_KERNELS = ("auto", "native", "torch")
#: ``auto`` makes the decoder's copy of the linear weights only up to this size.
AUTO_MAX_EXTRA_BYTES = 512 << 20
#: Most rows (tokens) one fused step takes: every step of the default budget (512 tokens) and of
#: budgets up to this; a larger step keeps the PyTorch forward (through the same panel products).
MAX_ROWS = 2048


class FusedDecoder:
    """Runs steps of up to :attr:`max_rows` tokens in one native call (see :meth:`accepts`; the
    PyTorch path keeps longer steps).

    Build it before the linear weights are packed: it copies the dense weights, in the order a
    step reads them, into one huge-page arena (so it holds its own copy of the linear weights)."""

    def __init__(
        self,
        model: CausalLM,
        kv_cache: torch.Tensor,
        block_size: int,
        max_rows: int = MAX_ROWS,
        panel_dtype: str = "float32",
    ) -> None:
        quantized = is_quantized(model)
        if quantized:
            panel_dtype = "gguf"  # no panels: the products read the model's own blocks
        elif panel_dtype not in PANEL_DTYPES:
            raise ValueError(f"panel dtype must be one of {', '.join(PANEL_DTYPES)}, not {panel_dtype!r}")
        lib = _library(panel_dtype, kv_cache.dtype == torch.bfloat16)
        if lib is None:
            raise RuntimeError("the fused decode library could not be built (see the log)")
        self.panel_dtype = panel_dtype
        self._fn = lib.fused_decode_f32
        self._draft_fn = lib.fused_draft_f32
        self._lora_fn = lib.fused_decode_lora_f32
        self.model = model
        args = model.args
        self.args = args
        self.block_size = block_size
        self.max_rows = max_rows
        self.eps = float(args.rms_norm_eps)
        self.scale = float(args.attn_scale)  # Gemma 2/3: query_pre_attn_scalar ** -0.5
        self._model_record = fused_library.model_record(model)
        self._keep: list[torch.Tensor] = []  # small tensors the native side points into
        stack = model.model
        big = [
            _weight(m)
            for layer in stack.layers
            for m in (
                layer.self_attn.qkv_proj,
                layer.self_attn.o_proj,
                layer.dense_mlp.gate_up_proj,
                layer.dense_mlp.down_proj,
            )
        ]
        big.append(_weight(model.lm_head))
        if quantized:
            big.append(stack.embed_tokens.weight_q)
        copies = self._place_weights(big, quantized, panel_dtype)
        self._panels = {} if quantized else copies  # id(weight) -> address of its panels
        self._linear_fn = lib.linear_panels

        ptr = self._pointer_fn(copies)
        self._layers = layer_records(model, ptr, kv_cache)
        if quantized:
            self._embed = copies[id(stack.embed_tokens.weight_q)]
        else:
            embed = stack.embed_tokens.weight.detach()  # rows, as they are (a tied lm_head's panels are a copy)
            self._keep.append(embed)
            self._embed = embed.data_ptr()
        self._final_norm = ptr(fused_library.norm_scale(stack.norm, args.norm_offset))
        self._lm_head = ptr(_weight(model.lm_head))
        self._init_buffers(args, block_size)

    def _pointer_fn(self, copies: dict[int, int]) -> Any:
        """``ptr(t)``: where the step reads ``t`` (its placed copy, else the float32 tensor itself, kept alive)."""

        def ptr(t: torch.Tensor | object | None) -> int | None:
            if t is None:
                return None
            if id(t) in copies:
                return copies[id(t)]
            assert isinstance(t, torch.Tensor)
            t = t.detach()
            assert t.dtype == torch.float32 and t.is_contiguous(), (t.dtype, t.shape)
            self._keep.append(t)
            return t.data_ptr()

        return ptr

    def _init_buffers(self, args: Any, block_size: int) -> None:
        """The step's work area (grown per call), the fixed part of its meta and the rotary tables (grown per call)."""
        hidden, inter = args.hidden_size, args.intermediate_size
        qkv = (args.num_heads + 2 * args.num_kv_heads) * args.head_dim
        self._work_per_row = 2 * hidden + qkv + args.num_heads * args.head_dim + 2 * inter
        self._work = torch.empty(0)
        #: meta[1:8] of every call (see the C source)
        self._dims = [
            args.hidden_size,
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            args.intermediate_size,
            args.vocab_size,
            block_size,
        ]
        self._rope_len = 0
        self._cos = self._sin = torch.empty(0)

    def _place_weights(self, big: list[Any], quantized: bool, panel_dtype: str) -> dict[int, int]:
        """Where the step reads each weight: a GGUF weight's qk_weight record (the blocks stay where the
        loader put them), or its panels in a new huge-page arena. Returns id(weight) -> address."""
        copies: dict[int, int] = {}
        if quantized:  # the weights stay where the loader put them; the step reads qk_weight records
            self._qweights = []
            for w in {id(w): w for w in big}.values():
                parts: list[Any] = list(w) if isinstance(w, torch.nn.ModuleList) else [w]  # a chain of records
                recs = [
                    QkWeight(
                        p.raw.data_ptr(),
                        p.raw.shape[1],
                        p.out_features,
                        p.in_features,
                        p.ggml_type,
                        int(p.packed is not None),
                        None,
                    )
                    for p in parts
                ]
                for rec, nxt in zip(recs, recs[1:]):
                    rec.next = ctypes.addressof(nxt)
                self._qweights += recs
                copies[id(w)] = ctypes.addressof(recs[0])
        else:
            self._arena_buf, self.arena, copies = pack_arena(big, PANEL_DTYPES[panel_dtype])
        return copies

    def attach_linear_layers(self, model: torch.nn.Module) -> int:
        """Make ``model``'s linear layers whose weights this decoder holds multiply through its
        panels (:class:`PanelWeight`: the PyTorch forward's steps over max_rows then use the same products
        as the fused step) and release their dense weights, unless shared (a tied lm_head): the
        linear weights are then held once. Returns how many layers were attached."""
        num = 0
        from tokenops.engine.kernels.weight_layout import shared_param_ids

        shared = shared_param_ids(model)
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if type(module) is not Linear or weight is None or id(weight) not in self._panels:
                continue
            bias = module.bias
            if bias is not None:
                assert bias.dtype == torch.float32 and bias.is_contiguous()
            module.panel = PanelWeight(self, self._panels[id(weight)], weight.shape[0], weight.shape[1])
            if id(weight) not in shared:
                module.weight = torch.nn.Parameter(weight.new_empty((0,)), requires_grad=False)
            num += 1
        return num

    def _rope_tables(self, max_pos: int) -> None:
        """cos/sin rows for positions [0, max_pos] (grown by doubling; the same function and
        arithmetic the PyTorch forward uses per step); Gemma 3's local layers read a second table after
        the first (their records' ``rope_off``)."""
        if max_pos < self._rope_len:
            return
        n = max(256, self._rope_len * 2)
        while n <= max_pos:
            n *= 2
        local = self.model.inv_freq_local
        tables = [
            rope_cos_sin(f, torch.arange(n), torch.float32) for f in (self.model.inv_freq, local) if f is not None
        ]
        self._cos = torch.cat([cos.reshape(n, -1) for cos, _ in tables]).contiguous()
        self._sin = torch.cat([sin.reshape(n, -1) for _, sin in tables]).contiguous()
        for i, layer in enumerate(self.model.model.layers):
            self._layers[i].rope_off = n * self.args.head_dim if layer.self_attn.rope_kind == "local" else 0
        self._rope_len = n

    def accepts(self, chunks: list[ChunkInput]) -> bool:
        """Steps of at most :attr:`max_rows` tokens in all: decodes, prefill chunks, speculative
        decoding's verify chunks, a draft model catching up on accepted tokens. Every token becomes a
        row; rows attend causally (each row's K/V is written before any row attends)."""
        return sum(len(c.token_ids) for c in chunks) <= self.max_rows

    def _meta(
        self, chunks: list[ChunkInput], ahead: list[int] | None = None, num_logits: list[int] | None = None
    ) -> tuple[torch.Tensor, int]:
        """The native step's int64 description of ``chunks`` (layout in the C source) and its number
        of logit rows: the last ``num_logits[i]`` rows of chunk i (default: each chunk's own
        ``num_logits``); ``ahead[i]`` more positions of chunk i are made addressable (drafting past it)."""
        bs = self.block_size
        ahead = ahead or [0] * len(chunks)
        for c, a in zip(chunks, ahead):
            if c.end_pos + a > len(c.block_table) * bs:
                raise ValueError(
                    f"block table of {len(c.block_table)} blocks cannot hold {c.end_pos + a} tokens (block_size {bs})"
                )
        tokens = [t for c in chunks for t in c.token_ids]
        positions = [c.start_pos + j for c in chunks for j in range(len(c.token_ids))]
        owners = [c for c in chunks for _ in c.token_ids]
        rows = len(tokens)
        lens = [p + 1 for p in positions]
        max_len = max(lens)
        width = (max(c.end_pos + a for c, a in zip(chunks, ahead)) + bs - 1) // bs
        self._rope_tables(max(c.end_pos - 1 + a for c, a in zip(chunks, ahead)))
        meta = [rows, *self._dims, width, self.args.num_layers, max_len]
        meta += tokens
        meta += [c.block_table[p // bs] * bs + p % bs for c, p in zip(owners, positions)]
        meta += lens
        meta += positions
        for c in chunks:  # the rows of one chunk share one pass over its cache
            meta += [len(c.token_ids)] + [0] * (len(c.token_ids) - 1)
        for c in owners:
            meta += c.block_table[:width]
            meta += [0] * (width - min(len(c.block_table), width))
        keep, at = list[int](), 0
        for c, n in zip(chunks, num_logits or [c.num_logits for c in chunks]):
            at += len(c.token_ids)
            keep.extend(range(at - n, at))
        meta += [len(keep), *keep]
        if self._work.numel() < rows * self._work_per_row:
            self._work = torch.empty(rows * self._work_per_row)
        return torch.tensor(meta, dtype=torch.long), len(keep)

    def _args(self, meta: torch.Tensor, logits: torch.Tensor) -> tuple:
        return (
            ctypes.addressof(self._layers),
            meta.data_ptr(),
            self.eps,
            self.scale,
            self._embed,
            self._final_norm,
            self._lm_head,
            self._cos.data_ptr(),
            self._sin.data_ptr(),
            logits.data_ptr(),
            self._work.data_ptr(),
            torch.get_num_threads(),
            ctypes.addressof(self._model_record),
        )

    @torch.inference_mode()
    def __call__(self, chunks: list[ChunkInput], lora: int | None = None) -> torch.Tensor:
        """float32 logits of the last ``num_logits`` tokens of each chunk, in order (as
        :meth:`ModelRunner.execute` returns them). ``lora``: the address of the step's LoRA
        description (:class:`tokenops.engine.lora.lora_native.NativeLora`; rows in chunk order), or None."""
        meta, num_rows = self._meta(chunks)
        logits = torch.empty(num_rows, self.args.vocab_size, dtype=torch.float32)
        rc = self._fn(*self._args(meta, logits)) if lora is None else self._lora_fn(*self._args(meta, logits), lora)
        if rc != 0:
            raise MemoryError("fused decode step could not allocate its buffers")
        return logits

    @torch.inference_mode()
    def draft_greedy(
        self, chunks: list[ChunkInput], num_tokens: list[int], min_confidence: float = 0.0
    ) -> tuple[list[list[int]], list[int]]:
        """Greedy proposals of a draft model in one native call: each chunk's argmax is fed back
        as its next token until it has ``num_tokens`` of them (each >= 1), or stops at a token of
        probability under ``min_confidence``. The same steps and argmax as calling this decoder
        once per token. Returns the tokens per chunk and the steps each ran (step ``j > 0`` wrote
        the K/V of position ``end_pos - 1 + j``)."""
        assert len(chunks) == len(num_tokens) and all(k >= 1 for k in num_tokens), num_tokens
        kmax = max(num_tokens)
        n = len(chunks)
        meta, _ = self._meta(chunks, ahead=[k - 1 for k in num_tokens], num_logits=[1] * n)
        logits = torch.empty(n, self.args.vocab_size, dtype=torch.float32)
        out = torch.zeros(n * kmax, dtype=torch.long)
        counts = torch.zeros(n, dtype=torch.long)
        steps = torch.zeros(n, dtype=torch.long)
        want = torch.tensor(num_tokens, dtype=torch.long)
        rc = self._draft_fn(
            *self._args(meta, logits),
            n,
            want.data_ptr(),
            kmax,
            float(min_confidence),
            out.data_ptr(),
            counts.data_ptr(),
            steps.data_ptr(),
        )
        if rc != 0:
            raise MemoryError("fused draft steps could not allocate their buffers")
        flat, counts_l = out.tolist(), counts.tolist()
        return [flat[i * kmax : i * kmax + counts_l[i]] for i in range(n)], steps.tolist()


def make_fused_decoder(
    model: torch.nn.Module,
    kv_cache: torch.Tensor,
    block_size: int,
    device: torch.device,
    mode: str,
    panel_dtype: str = "float32",
) -> FusedDecoder | None:
    """The decoder for ``[engine] decode_kernel = mode`` with its weights in ``panel_dtype``, or None
    (logged when ``auto`` declines)."""
    if mode not in DECODE_KERNELS:
        raise ValueError(f"engine decode_kernel must be one of {', '.join(DECODE_KERNELS)}, not {mode!r}")
    if mode == "torch":
        return None
    why = ineligible_reason(model, kv_cache, device)
    copy_bytes = fused_library.dense_linear_bytes(model) if why is None else 0
    if mode == "auto" and copy_bytes > AUTO_MAX_EXTRA_BYTES:
        why = (
            f"its weight copy ({copy_bytes / 2**20:.0f} MiB) would exceed "
            f"{AUTO_MAX_EXTRA_BYTES >> 20} MiB (decode_kernel = 'native' forces it)"
        )
    if why is None and _library(panel_dtype, kv_cache.dtype == torch.bfloat16) is None:
        why = "the library could not be built (see the log)"
    if why is not None:
        if mode == "native":
            raise ValueError(f"engine decode_kernel 'native' is unavailable: {why}")
        log.info("fused decode step off: %s", why)
        return None
    return FusedDecoder(model, kv_cache, block_size, panel_dtype=panel_dtype) if isinstance(model, CausalLM) else None
