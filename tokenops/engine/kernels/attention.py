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
:meth:`AttentionMetadata.build` (:mod:`tokenops.engine.kernels.attention_metadata`) and shared by all layers.

Gemma 2 caps attention scores (``cap * tanh(scores / cap)``, before the mask), which
SDPA cannot do: layers with a ``softcap`` attend through :func:`softcapped_attention`,
the same two matmuls and softmax written out (the runner keeps the compiled decode kernel
off for such models).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenops.engine.kernels.attention_metadata import AttentionMetadata, DecodeGroup, PrefillSpan, additive_mask

__all__ = ["AttentionMetadata", "paged_attention", "softcapped_attention"]


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
        float32 scales of K and V (see :mod:`tokenops.engine.kv.kv_quant`).
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
                mask = additive_mask(torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), q.dtype)
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
    from tokenops.engine.kv.kv_quant import dequantize_kv, quantize_kv

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
