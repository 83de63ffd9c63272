"""The Llama-shaped decoder shared by every supported family.

Llama 2/3, Qwen2/2.5, Qwen3, Mistral, Phi-3 and Gemma 1/2/3 differ only in flags
carried by :class:`ModelArgs` (attention bias, q/k norm, sliding window, RoPE scaling and
partial rotation, tied embeddings; Gemma's scaled embeddings, (1 + w) norms, norms after
attention and around the MLP, soft-capped scores and logits, per-layer rotary bases);
Mixtral and the Qwen MoE models swap the MLP of some layers for a :class:`SparseMoeBlock`.
Module names follow Hugging Face's so checkpoint names map one to one, except the fused
``qkv_proj`` / ``gate_up_proj`` / stacked experts, which :meth:`CausalLM.load_weights`
fills shard by shard (Phi-3 stores them fused already).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from tokenops.engine.kernels.attention import AttentionMetadata
from tokenops.engine.models.args import ModelArgs
from tokenops.engine.models.layers import Embedding, GatedMLP, Linear, RMSNorm, SelfAttention
from tokenops.engine.models.moe import SparseMoeBlock
from tokenops.engine.models.rope import rope_cos_sin

# HF suffix -> (our suffix, shard index along dim 0 in units of the shard sizes)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
    "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", 0),
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", 1),
}
# Per-expert HF names: Mixtral (w1 gate, w3 up, w2 down) and Qwen (gate/up/down_proj).
_EXPERT = re.compile(r"^(model\.layers\.\d+)\.mlp\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_EXPERT_PART = {"w1": ("w_gate_up", 0), "gate_proj": ("w_gate_up", 0), "w3": ("w_gate_up", 1),
                "up_proj": ("w_gate_up", 1), "w2": ("w_down", None), "down_proj": ("w_down", None)}  # fmt: skip
# transformers >= 5 may also store experts already stacked.
_STACKED = {"mlp.experts.gate_up_proj": "mlp.w_gate_up", "mlp.experts.down_proj": "mlp.w_down"}
# Fused parameters and their number of shards (a checkpoint may hold them whole: Phi-3).
_NUM_SHARDS = {"qkv_proj": 3, "gate_up_proj": 2}


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP (dense or MoE) with residuals; with ``sandwich_norms``
    (Gemma) the outputs of attention and MLP are normed too, and HF's
    ``post_attention_layernorm`` is the one after attention (the MLP's input norm is
    ``pre_feedforward_layernorm``)."""

    def __init__(self, args: ModelArgs, layer_idx: int, **factory) -> None:
        super().__init__()
        self.self_attn = SelfAttention(args, layer_idx, **factory)
        if args.moe_layers[layer_idx]:
            self.mlp: nn.Module = SparseMoeBlock(args, **factory)
        else:
            self.mlp = GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.mlp_bias, **factory)
        norm = args.hidden_size, args.rms_norm_eps, args.norm_offset
        self.input_layernorm = RMSNorm(*norm, **factory)
        self.post_attention_layernorm = RMSNorm(*norm, **factory)
        self.is_sandwich = args.sandwich_norms
        if self.is_sandwich:
            self.pre_feedforward_layernorm = RMSNorm(*norm, **factory)
            self.post_feedforward_layernorm = RMSNorm(*norm, **factory)

    @property
    def dense_mlp(self) -> GatedMLP:
        """``mlp`` of a dense layer (the fused decode step reads it; it refuses MoE models first)."""
        assert isinstance(self.mlp, GatedMLP)
        return self.mlp

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if self.is_sandwich:
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, meta))
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderLayers(nn.ModuleList):
    """An ``nn.ModuleList`` of :class:`DecoderLayer` that says so to the type checker."""

    if TYPE_CHECKING:

        def __iter__(self) -> Iterator[DecoderLayer]: ...


class DecoderStack(nn.Module):
    """Embeddings, layers and final norm (HF's ``model.`` prefix)."""

    def __init__(self, args: ModelArgs, **factory) -> None:
        super().__init__()
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size, **factory)
        self.layers = DecoderLayers(DecoderLayer(args, i, **factory) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, args.norm_offset, **factory)


class CausalLM(nn.Module):
    """A decoder-only LM over a paged KV cache.

    ``forward(input_ids, positions, meta, logits_index)`` runs all tokens of a step
    (flattened, no batch axis) and returns logits only for the rows in
    ``logits_index`` — the last token of each chunk — so prefill never pays for the
    full vocabulary projection.
    """

    # buffers (register_buffer), declared for the type checker
    inv_freq: torch.Tensor
    inv_freq_long: torch.Tensor
    inv_freq_local: torch.Tensor | None  # Gemma 3's local layers only
    #: set by the GGUF loader only (others read it with getattr and a default)
    quantized_format: str

    def __init__(
        self, args: ModelArgs, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.args = args
        # Parameters are created uninitialised directly on the target device and dtype;
        # load_weights fills them.
        factory = {"device": device, "dtype": dtype}
        self.model = DecoderStack(args, **factory)
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False, **factory)
        # Rotary tables in float32: ``inv_freq`` of the global layers (what the fused step reads),
        # LongRoPE's long-sequence table, Gemma 3's local table.
        self.rope = args.rope_spec()
        self.local_rope = args.rope_spec(local=True) if args.local_rope_theta is not None else None
        self.register_buffer("inv_freq", self.rope.inv_freq().to(device), persistent=False)
        self.register_buffer("inv_freq_long", self.rope.inv_freq(long=True).to(device), persistent=False)
        self.register_buffer(
            "inv_freq_local", self.local_rope.inv_freq().to(device) if self.local_rope else None, persistent=False
        )

    @property
    def attention_windows(self) -> set[int | None]:
        return set(self.args.layer_windows)

    def attention_layers(self) -> list[SelfAttention]:
        return [layer.self_attn for layer in self.model.layers]

    def moe_blocks(self) -> list[SparseMoeBlock | None]:
        return [layer.mlp if isinstance(layer.mlp, SparseMoeBlock) else None for layer in self.model.layers]

    def reset_buffers(self) -> None:
        """Recompute the rotary table in float32 (a ``.to(dtype)`` would have cast it) and
        zero the expert counters."""
        device = self.inv_freq.device
        self.inv_freq = self.rope.inv_freq().to(device)
        self.inv_freq_long = self.rope.inv_freq(long=True).to(device)
        if self.local_rope is not None:
            self.inv_freq_local = self.local_rope.inv_freq().to(device)
        for block in self.moe_blocks():
            if block is not None:
                block.expert_counts.zero_()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_index: torch.Tensor,
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        if self.args.embed_scale != 1.0:
            x = x * torch.tensor(self.args.embed_scale, dtype=x.dtype)
        tables = {"global": self._cos_sin(positions, meta, x.dtype)}
        if self.local_rope is not None:
            assert self.inv_freq_local is not None  # registered whenever there is a local rope
            tables["local"] = rope_cos_sin(self.inv_freq_local, positions, x.dtype, self.local_rope.attention_factor())
        for layer in self.model.layers:
            x = layer(x, *tables[layer.self_attn.rope_kind], meta)
        logits = self.lm_head(self.model.norm(x[logits_index]))
        cap = self.args.final_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def _cos_sin(self, positions: torch.Tensor, meta: AttentionMetadata, dtype: torch.dtype):
        """The global layers' cos/sin. LongRoPE switches a chunk to the long factors when the
        sequence it ends is longer than the original context, as transformers does per forward
        (a chunked prefill that crosses that length rotates its early chunks with the short ones)."""
        factor = self.rope.attention_factor()
        cos, sin = rope_cos_sin(self.inv_freq, positions, dtype, factor)
        if not self.rope.is_longrope:
            return cos, sin
        ends = positions + 1  # a decode ends its sequence at its own position
        for span in meta.prefills:
            ends[span.token_start : span.token_end] = span.start_pos + span.token_end - span.token_start
        is_long = (ends > self.rope.original_max_positions)[:, None, None]
        if not bool(is_long.any()):
            return cos, sin
        cos_l, sin_l = rope_cos_sin(self.inv_freq_long, positions, dtype, factor)
        return torch.where(is_long, cos_l, cos), torch.where(is_long, sin_l, sin)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into this model; every parameter must be filled."""
        params = dict(self.named_parameters(remove_duplicate=False))
        filled: set[tuple[str, int | None, int | None]] = set()
        expected: set[tuple[str, int | None, int | None]] = set()
        for name, param in params.items():
            if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
                expected.update((name, i, None) for i in range(3))
            elif name.endswith("gate_up_proj.weight") or name.endswith("gate_up_proj.bias"):
                expected.update((name, i, None) for i in range(2))
            elif name.endswith("w_gate_up"):
                expected.update((name, i, e) for i in range(2) for e in range(param.shape[0]))
            elif name.endswith("w_down"):
                expected.update((name, None, e) for e in range(param.shape[0]))
            else:
                expected.add((name, None, None))
        if self.args.tie_word_embeddings:
            expected.discard(("lm_head.weight", None, None))
        for hf_name, tensor in weights:
            for key in self._load_one(params, hf_name, tensor):
                filled.add(key)
        if self.args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        missing = sorted({k[0] for k in expected - filled})
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} weight(s), e.g. {', '.join(missing[:3])}")

    def _load_one(self, params: dict[str, nn.Parameter], hf_name: str, tensor: torch.Tensor):
        name = hf_name.replace(".block_sparse_moe.", ".mlp.")
        if name.endswith("rotary_emb.inv_freq"):
            return
        if self.args.tie_word_embeddings and name == "lm_head.weight":
            return
        match = _EXPERT.match(name)
        if match:
            prefix, expert, part = match.group(1), int(match.group(2)), match.group(3)
            target, shard = _EXPERT_PART[part]
            param = params[f"{prefix}.mlp.{target}"]
            _copy_shard(param.data[expert], tensor, shard, [param.shape[1] // 2] * 2 if shard is not None else None)
            yield f"{prefix}.mlp.{target}", shard, expert
            return
        for hf_part, ours in _STACKED.items():
            if name.endswith(hf_part):
                target = name[: -len(hf_part)] + ours
                _copy_shard(_param(params, target, hf_name).data, tensor, None, None)
                for e in range(tensor.shape[0]):
                    for shard in (0, 1) if ours.endswith("gate_up") else (None,):
                        yield target, shard, e
                return
        base, _, kind = name.rpartition(".")
        num_shards = _NUM_SHARDS.get(base.rpartition(".")[2])
        if num_shards is not None:  # stored fused (Phi-3): same layout as ours, q|k|v and gate|up
            _copy_shard(_param(params, name, hf_name).data, tensor, None, None)
            for shard in range(num_shards):
                yield name, shard, None
            return
        for hf_part, (ours, shard) in _FUSED.items():
            if base.endswith(hf_part):
                target = f"{base[: -len(hf_part)]}{ours}.{kind}"
                param = _param(params, target, hf_name)
                sizes = self._shard_sizes(ours, param)
                _copy_shard(param.data, tensor, shard, sizes)
                yield target, shard, None
                return
        _copy_shard(_param(params, name, hf_name).data, tensor, None, None)
        yield name, None, None

    def _shard_sizes(self, ours: str, param: torch.Tensor) -> list[int]:
        if ours.endswith("qkv_proj"):
            q = self.args.num_heads * self.args.head_dim
            kv = self.args.num_kv_heads * self.args.head_dim
            return [q, kv, kv]
        return [param.shape[0] // 2] * 2


def _param(params: dict[str, nn.Parameter], name: str, hf_name: str) -> nn.Parameter:
    if name not in params:
        raise ValueError(f"unexpected weight {hf_name!r} in checkpoint (no matching parameter)")
    return params[name]


def _copy_shard(dst: torch.Tensor, src: torch.Tensor, shard: int | None, sizes: list[int] | None) -> None:
    if shard is not None:
        assert sizes is not None
        start = sum(sizes[:shard])
        dst = dst[start : start + sizes[shard]]
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"weight shape mismatch: checkpoint {tuple(src.shape)} vs model {tuple(dst.shape)}")
    dst.copy_(src)
