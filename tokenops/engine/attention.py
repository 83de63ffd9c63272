"""Paged attention over a block-structured KV cache.

The cache of one layer is a pair of tensors ``[num_blocks, block_size, num_kv_heads,
head_dim]``; token ``pos`` of a sequence lives in slot
``block_table[pos // block_size] * block_size + pos % block_size``.

A step mixes two kinds of work, and :class:`AttentionMetadata` arranges them so
each costs few kernel calls per layer:

- *decodes* (one new token with cached context) are batched: sorted by context
  length and split into a few groups of similar length (:func:`split_by_length`),
  each ONE ``scaled_dot_product_attention`` call over contexts gathered from the
  cache into a padded ``[B, kv_heads, L, head_dim]`` tensor, with a mask hiding the
  padding. Grouped-query heads are folded into the query-length axis so K/V are
  never repeated.
- *prefill chunks* run one SDPA call each with a causal mask offset by the chunk's
  start position; a chunk starting at position 0 attends to its own fresh K/V
  without touching the cache.

Everything that depends only on the step (gather indices, masks) is built once in
:meth:`AttentionMetadata.build` and shared by all layers.

Gemma 2 caps attention scores (``cap * tanh(scores / cap)``, before the mask), which
SDPA cannot do: layers with a ``softcap`` attend through :func:`softcapped_attention`,
the same two matmuls and softmax written out (the runner keeps the compiled decode kernel
off for such models).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from tokenops.engine.batch import ChunkInput


@dataclass(slots=True)
class PrefillSpan:
    """One prefill chunk: its token rows in the step and how to reach its context."""

    token_start: int
    token_end: int
    start_pos: int
    context_slots: torch.Tensor | None  # [start_pos + n] slots, None when start_pos == 0
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)  # window -> [n, ctx] additive


@dataclass(slots=True)
class DecodeGroup:
    """Decodes with similar context lengths, attended in one padded SDPA call."""

    row_start: int
    row_end: int
    length: int  # L: the longest context in the group
    slots: torch.Tensor  # [rows * L] context slots (padded), flattened
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # window -> [rows, 1, 1, L] additive


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step tensors shared by every attention layer.

    Tokens are ordered decodes first (rows ``0 .. num_decodes-1``), then the prefill
    chunks in :attr:`prefills` order. Decodes are split into :attr:`decode_groups` of
    similar context length, so padding to the longest context wastes little (the
    runner orders decodes longest first).
    """

    slot_mapping: torch.Tensor  # [T] cache slot of each token of the step
    num_decodes: int
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillSpan]
    workspace: torch.Tensor | None = None  # decode gather buffer, shared by all layers
    #: With the compiled kernel (:mod:`tokenops.engine.native`) decodes skip the groups:
    #: the kernel reads the cache through ``[num_decodes, max_blocks]`` block tables.
    native: Any = None
    decode_tables: torch.Tensor | None = None
    decode_lens: torch.Tensor | None = None
    decode_max_len: int = 0

    @classmethod
    def build(
        cls,
        chunks: list[ChunkInput],
        block_size: int,
        device: torch.device,
        windows: set[int | None],
        dtype: torch.dtype = torch.float32,
        native: Any = None,
    ) -> AttentionMetadata:
        """Build the metadata for ``chunks`` (already ordered decodes first).

        :param windows: the distinct sliding-window sizes of the model's layers
            (``None`` for full attention); one mask is built per value.
        :param dtype: the model's dtype (masks are additive, which SDPA runs faster
            than boolean ones on CPU).
        :param native: the compiled decode kernel, or None for gather + SDPA.
        """
        decodes = [c for c in chunks if c.is_decode]
        num_decodes = len(decodes)
        assert all(c.is_decode for c in chunks[:num_decodes]), "decodes must come first"
        slots: list[int] = []
        for c in chunks:
            slots.extend(_slots(c.block_table, c.start_pos, c.end_pos, block_size))
        slot_mapping = torch.tensor(slots, dtype=torch.long, device=device)

        groups = []
        tables = lens = None
        max_len = 0
        if native is not None and decodes:
            max_len = max(c.end_pos for c in decodes)
            width = (max_len + block_size - 1) // block_size
            tables = torch.tensor(
                [c.block_table[:width] + [0] * (width - min(len(c.block_table), width)) for c in decodes],
                dtype=torch.long,
                device=device,
            )
            lens = torch.tensor([c.end_pos for c in decodes], dtype=torch.long, device=device)
        else:
            for start, end in split_by_length([c.end_pos for c in decodes]):
                groups.append(_decode_group(decodes[start:end], start, block_size, device, windows, dtype))

        prefills = []
        row = num_decodes
        for c in chunks[num_decodes:]:
            n = c.num_tokens
            context = None
            evicted = None
            if c.start_pos > 0:
                context_slots = _slots(c.block_table, 0, c.end_pos, block_size)
                if min(context_slots) < 0:  # evicted blocks (see _decode_group)
                    evicted = torch.tensor([s < 0 for s in context_slots], device=device)
                    context_slots = [max(s, 0) for s in context_slots]
                context = torch.tensor(context_slots, dtype=torch.long, device=device)
            span = PrefillSpan(row, row + n, c.start_pos, context)
            for window in windows:
                mask = _prefill_mask(c.start_pos, n, window, device)
                if evicted is not None:
                    causal = mask if mask is not None else _prefill_mask(c.start_pos, n, 0, device)
                    assert causal is not None  # window 0 always builds the mask
                    mask = causal & ~evicted[None, :]
                span.masks[window] = None if mask is None else _additive(mask, dtype)
            prefills.append(span)
            row += n
        return cls(
            slot_mapping,
            num_decodes,
            groups,
            prefills,
            native=native if tables is not None else None,
            decode_tables=tables,
            decode_lens=lens,
            decode_max_len=max_len,
        )


# A group costs a couple of kernel launches per layer, about as much as gathering
# this many padded context rows.
_GROUP_COST_ROWS = 64


def split_by_length(lengths: list[int]) -> list[tuple[int, int]]:
    """Split consecutive ``lengths`` into ``[start, end)`` groups minimising padded
    rows (``len(group) * max(group)``) plus a fixed cost per group."""
    n = len(lengths)
    if n == 0:
        return []
    if n > 64:  # keep the quadratic search cheap; big batches use fixed-size groups
        return [(i, min(i + 32, n)) for i in range(0, n, 32)]
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        longest = 0
        for start in range(end - 1, -1, -1):
            longest = max(longest, lengths[start])
            cost = best[start] + longest * (end - start) + _GROUP_COST_ROWS
            if cost < best[end]:
                best[end], cut[end] = cost, start
    bounds = []
    end = n
    while end > 0:
        bounds.append((cut[end], end))
        end = cut[end]
    return bounds[::-1]


def _decode_group(decodes, row_start, block_size, device, windows, dtype) -> DecodeGroup:
    length = max(c.end_pos for c in decodes)
    num_blocks = (length + block_size - 1) // block_size
    tables = [c.block_table[:num_blocks] + [0] * (num_blocks - min(len(c.block_table), num_blocks)) for c in decodes]
    table = torch.tensor(tables, dtype=torch.long, device=device)
    pos = torch.arange(length, device=device)
    # a negative block id marks a block evicted by a KV policy (sink + window): masked out
    evicted = table[:, pos // block_size] < 0 if min(min(t) for t in tables) < 0 else None
    slots = (table.clamp(min=0)[:, pos // block_size] * block_size + pos % block_size).view(-1)
    group = DecodeGroup(row_start, row_start + len(decodes), length, slots)
    ctx = torch.tensor([c.end_pos for c in decodes], dtype=torch.long, device=device)[:, None]
    for window in windows:
        keep = pos[None, :] < ctx
        if evicted is not None:
            keep &= ~evicted
        if window is not None:
            keep &= pos[None, :] > ctx - 1 - window
        group.masks[window] = _additive(keep, dtype)[:, None, None, :]
    return group


def _slots(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions ``[start, end)``; -1 for positions in evicted blocks."""
    if end > len(block_table) * block_size:
        raise ValueError(f"block table of {len(block_table)} blocks cannot hold {end} tokens (block_size {block_size})")
    out = []
    for p in range(start, end):
        block = block_table[p // block_size]
        out.append(block * block_size + p % block_size if block >= 0 else -1)
    return out


def _additive(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mask = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    return mask.masked_fill_(~keep, float("-inf"))


def _prefill_mask(start_pos: int, n: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """``[n, start_pos + n]`` bool mask, or None where plain ``is_causal`` is exact."""
    if start_pos == 0 and window is None:
        return None
    q_pos = torch.arange(start_pos, start_pos + n, device=device)[:, None]
    k_pos = torch.arange(start_pos + n, device=device)[None, :]
    keep = k_pos <= q_pos
    if window:  # 0 builds the plain causal mask
        keep &= k_pos > q_pos - window
    return keep


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int | None = None,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Write ``k``/``v`` into the cache, then attend.

    :param q: ``[T, num_heads, head_dim]`` queries of the step's tokens.
    :param k: ``[T, num_kv_heads, head_dim]`` new keys (``v`` likewise).
    :param k_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (``v_cache`` likewise).
    :param kv_scales: int8 cache only: the ``[num_blocks, block_size, num_kv_heads]``
        float32 scales of K and V (see :mod:`tokenops.engine.kv_quant`).
    :param softcap: Gemma 2's attention logit soft-capping, or None.
    :returns: ``[T, num_heads, head_dim]``.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group_size = num_heads // num_kv_heads
    if kv_scales is not None:
        return _int8_attention(q, k, v, k_cache, v_cache, kv_scales, meta, scale, window, softcap)
    assert softcap is None or meta.native is None, "the compiled decode kernel does not soft-cap scores"
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    if k_cache.dtype != q.dtype:  # a narrower cache (kv_cache_dtype "bfloat16"): attend over the rounded values
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k_flat.index_copy_(0, meta.slot_mapping, k)
    v_flat.index_copy_(0, meta.slot_mapping, v)
    if k_cache.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)

    if meta.native is not None:
        nd = meta.num_decodes
        decoded = meta.native(
            q[:nd], k_cache, v_cache, meta.decode_tables, meta.decode_lens, meta.decode_max_len, scale, window
        )
        if not meta.prefills:
            return decoded
        out = torch.empty_like(q)
        out[:nd] = decoded
    elif len(meta.decode_groups) == 1 and not meta.prefills:
        return _decode(q, k_flat, v_flat, meta.decode_groups[0], meta, scale, window, group_size, softcap)
    else:
        out = torch.empty_like(q)
    for group in meta.decode_groups:
        rows = slice(group.row_start, group.row_end)
        out[rows] = _decode(q[rows], k_flat, v_flat, group, meta, scale, window, group_size, softcap)
    for span in meta.prefills:
        s, e = span.token_start, span.token_end
        if span.context_slots is None:
            ks, vs = k[s:e], v[s:e]
        else:
            ks = k_flat.index_select(0, span.context_slots).to(q.dtype)
            vs = v_flat.index_select(0, span.context_slots).to(q.dtype)
        mask = span.masks[window]
        qs, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q[s:e], ks, vs))
        if softcap is not None:
            if group_size > 1:  # query head h reads KV head h // group_size
                kt, vt = kt.repeat_interleave(group_size, dim=1), vt.repeat_interleave(group_size, dim=1)
            if mask is None:  # a fresh chunk from position 0: plain causal
                n = e - s
                mask = _additive(torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), q.dtype)
            o = softcapped_attention(qs, kt, vt, mask, scale, softcap)
        else:
            o = F.scaled_dot_product_attention(
                qs, kt, vt, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=group_size > 1
            )
        out[s:e] = o[0].transpose(0, 1)
    return out


def softcapped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    """Attention with scores capped to ``(-softcap, softcap)`` by ``softcap * tanh(s / softcap)``
    before the additive ``mask`` (Gemma 2); softmax in float32. ``k``/``v`` have as many heads
    as ``q`` or broadcast to them."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap + mask
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


def _decode(
    q,
    k_flat,
    v_flat,
    group: DecodeGroup,
    meta: AttentionMetadata,
    scale: float,
    window,
    group_size: int,
    softcap: float | None = None,
):
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = num_heads // group_size
    # One gather buffer serves every group and layer of the step; index_select into
    # it is several times faster than advanced indexing on CPU.
    num_slots = len(group.slots)
    if meta.workspace is None or meta.workspace.shape[1] < num_slots or meta.workspace.dtype != k_flat.dtype:
        meta.workspace = k_flat.new_empty((2, num_slots, num_kv_heads, head_dim))
    shape = (num_rows, group.length, num_kv_heads, head_dim)
    # [B, L, kv, d] -> [B, kv, L, d]; the query heads sharing a KV head become the
    # query-length axis, so one KV head serves its whole group without a copy.
    ks = torch.index_select(k_flat, 0, group.slots, out=meta.workspace[0, :num_slots]).view(shape).transpose(1, 2)
    vs = torch.index_select(v_flat, 0, group.slots, out=meta.workspace[1, :num_slots]).view(shape).transpose(1, 2)
    qs = q.view(num_rows, num_kv_heads, group_size, head_dim)
    ks, vs = ks.to(q.dtype), vs.to(q.dtype)  # no copy unless the cache is narrower than the queries
    if softcap is not None:
        o = softcapped_attention(qs, ks, vs, group.masks[window], scale, softcap)
    else:
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=group.masks[window], scale=scale)
    return o.reshape(num_rows, num_heads, head_dim)


def _int8_attention(
    q, k, v, k_cache, v_cache, kv_scales, meta: AttentionMetadata, scale: float, window, softcap: float | None = None
):
    """int8 cache: quantize the step's K/V into the cache, then attend over a dequantized
    copy of the slots this step reads (the step's own chunks at position 0 use exact K/V)."""
    from tokenops.engine.kv_quant import dequantize_kv, quantize_kv

    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_flat, v_flat = k_cache.view(-1, num_kv_heads, head_dim), v_cache.view(-1, num_kv_heads, head_dim)
    ks_flat, vs_flat = kv_scales[0].view(-1, num_kv_heads), kv_scales[1].view(-1, num_kv_heads)
    for x, flat, scales in ((k, k_flat, ks_flat), (v, v_flat, vs_flat)):
        values, s = quantize_kv(x)
        flat.index_copy_(0, meta.slot_mapping, values)
        scales.index_copy_(0, meta.slot_mapping, s)
    # Gather every slot the step reads once, dequantize, and attend through the plain
    # path over that compact float cache (slot ids remapped into it).
    needed = [g.slots for g in meta.decode_groups] + [
        p.context_slots for p in meta.prefills if p.context_slots is not None
    ]
    if not needed:
        return paged_attention(
            q,
            k,
            v,
            k.new_zeros((1, 1, num_kv_heads, head_dim)),
            v.new_zeros((1, 1, num_kv_heads, head_dim)),
            _local(meta, None),
            scale,
            window,
            softcap=softcap,
        )
    slots = torch.cat(needed).unique()
    pad = k.new_zeros((1, num_kv_heads, head_dim))  # scratch row for writes nobody reads
    k_local = torch.cat([dequantize_kv(k_flat.index_select(0, slots), ks_flat.index_select(0, slots), q.dtype), pad])
    v_local = torch.cat([dequantize_kv(v_flat.index_select(0, slots), vs_flat.index_select(0, slots), q.dtype), pad])
    remap = torch.full((k_flat.shape[0],), -1, dtype=torch.long, device=slots.device)
    remap[slots] = torch.arange(len(slots), device=slots.device)
    local = _local(meta, remap)
    return paged_attention(q, k, v, k_local.unsqueeze(1), v_local.unsqueeze(1), local, scale, window, softcap=softcap)


def _local(meta: AttentionMetadata, remap: torch.Tensor | None) -> AttentionMetadata:
    """``meta`` with slots renumbered into a compact cache; the step's own new tokens are
    written there too only when they are read (slots outside it go to a scratch row)."""
    if remap is None:
        groups: list[DecodeGroup] = []
        prefills = [PrefillSpan(p.token_start, p.token_end, p.start_pos, None, p.masks) for p in meta.prefills]
        return AttentionMetadata(torch.zeros_like(meta.slot_mapping), 0, groups, prefills)
    scratch = int((remap >= 0).sum())
    mapped = remap[meta.slot_mapping]
    write = torch.where(mapped >= 0, mapped, torch.full_like(mapped, scratch))
    groups = [DecodeGroup(g.row_start, g.row_end, g.length, remap[g.slots], g.masks) for g in meta.decode_groups]
    prefills = [
        PrefillSpan(
            p.token_start,
            p.token_end,
            p.start_pos,
            None if p.context_slots is None else remap[p.context_slots],
            p.masks,
        )
        for p in meta.prefills
    ]
    return AttentionMetadata(write, meta.num_decodes, groups, prefills)
