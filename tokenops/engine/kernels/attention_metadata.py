"""The per-step metadata of paged attention (:mod:`tokenops.engine.kernels.attention`): cache slots,
decode groups of similar context length and their masks, prefill spans. Everything that depends
only on the step is built once in :meth:`AttentionMetadata.build` and shared by all layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tokenops.engine.core.batch import ChunkInput


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
    #: With the compiled kernel (:mod:`tokenops.engine.kernels.native`) decodes skip the groups:
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
                span.masks[window] = None if mask is None else additive_mask(mask, dtype)
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
        group.masks[window] = additive_mask(keep, dtype)[:, None, None, :]
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


def additive_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``keep``, -inf elsewhere (SDPA runs additive masks faster than boolean ones on CPU)."""
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
