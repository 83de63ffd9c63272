"""Which evicted prefix-cache blocks the KV offload tier holds, and where (plain Python).

The tier is a second level below the engine's KV pool, as LMCache / vLLM's KV
offloading / SGLang's HiCache: a full, registered block that the block manager evicts
is copied to a bounded host-memory tier (and, when that overflows, to an optional
disk tier) under the SAME chained block hash; a later prefix lookup that misses in the
pool but hits here gets the block copied back instead of recomputed.

This module only keeps the books (host slots, disk entries, LRU order, counters) and
emits :data:`TransferOp` tuples; the tensor side (:mod:`tokenops.engine.kv.offload_store`)
executes them **in the order emitted**. That order is what makes the bookkeeping
immediate yet safe: a save of a pool block is emitted before anything can overwrite
that block (the load into it or the forward come later), and a load from a host slot
is emitted before a later save can reuse the slot.

Ops:

- ``("save", block_id, slot)``: pool block -> host slot.
- ``("load", slot, block_id)``: host slot -> pool block.
- ``("spill", slot, key)``: host slot -> disk entry ``key`` (the host entry was evicted).
- ``("load_disk", key, block_id)``: disk entry -> pool block.
- ``("drop_disk", key)``: delete the disk entry (evicted from the disk tier).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

TransferOp = tuple[Any, ...]


@dataclass(slots=True)
class _Entry:
    salt: str | None
    token_ids: tuple[int, ...]
    slot: int = -1  # host slot, or -1 when the entry lives on disk


class OffloadIndex:
    """LRU host tier of ``num_host_slots`` blocks, spilling to ``num_disk_blocks`` on disk."""

    def __init__(self, num_host_slots: int, num_disk_blocks: int = 0) -> None:
        assert num_host_slots > 0 and num_disk_blocks >= 0
        self.num_host_slots = num_host_slots
        self.num_disk_blocks = num_disk_blocks
        self._host: OrderedDict[int, _Entry] = OrderedDict()  # key -> entry, least recent first
        self._disk: OrderedDict[int, _Entry] = OrderedDict()
        self._free_slots = list(range(num_host_slots - 1, -1, -1))
        self.num_saved_blocks = 0  # pool -> host copies
        self.num_loaded_blocks = 0  # tier -> pool copies (hits), host and disk
        self.num_disk_loaded_blocks = 0
        self.num_spilled_blocks = 0
        self.num_dropped_blocks = 0  # fell out of the last tier (or found no slot)

    @property
    def num_host_blocks(self) -> int:
        return len(self._host)

    @property
    def num_disk_blocks_used(self) -> int:
        return len(self._disk)

    def contains(self, key: int, salt: str | None, token_ids: tuple[int, ...]) -> bool:
        """Whether the tier holds ``key`` for the same tenant and tokens (a hash collision
        or another tenant's block is a miss)."""
        entry = self._host.get(key) or self._disk.get(key)
        return entry is not None and entry.salt == salt and entry.token_ids == token_ids

    def save(
        self, key: int, salt: str | None, token_ids: tuple[int, ...], block_id: int, ops: list[TransferOp]
    ) -> None:
        """The pool evicts ``block_id`` (registered as ``key``): keep a copy."""
        for tier in (self._host, self._disk):
            if key in tier:  # recomputed while the tier held it (e.g. the block of a prompt's last
                tier.move_to_end(key)  # token, which lookups never take): same hash, same K/V
                return
        if self._free_slots:
            slot = self._free_slots.pop()
        elif self._host:
            slot = self._evict_host(ops)
        else:  # every slot is claimed by the allocation in progress
            self.num_dropped_blocks += 1
            return
        self._host[key] = _Entry(salt, token_ids, slot)
        ops.append(("save", block_id, slot))
        self.num_saved_blocks += 1

    def claim(self, key: int) -> _Entry:
        """Take ``key`` (which :meth:`contains` found) out of the tier, its host slot held
        until :meth:`load`, so saves made while the pool finds it a block cannot reuse it.
        The tiers are exclusive: a block lives in the pool or in the tier."""
        entry = self._host.pop(key, None)
        return entry if entry is not None else self._disk.pop(key)

    def load(self, key: int, entry: _Entry, block_id: int, ops: list[TransferOp]) -> None:
        """Copy the claimed ``entry`` into the fresh pool block ``block_id``."""
        if entry.slot >= 0:
            ops.append(("load", entry.slot, block_id))
            self._free_slots.append(entry.slot)  # later saves into it are ordered after this load
        else:
            ops.append(("load_disk", key, block_id))
            ops.append(("drop_disk", key))
            self.num_disk_loaded_blocks += 1
        self.num_loaded_blocks += 1

    def clear(self, ops: list[TransferOp]) -> int:
        """Forget every entry; returns how many there were."""
        num = len(self._host) + len(self._disk)
        for key in self._disk:
            ops.append(("drop_disk", key))
        self._host.clear()
        self._disk.clear()
        self._free_slots = list(range(self.num_host_slots - 1, -1, -1))
        return num

    def stats(self) -> dict[str, int]:
        return {
            "host_blocks": self.num_host_blocks,
            "host_capacity_blocks": self.num_host_slots,
            "disk_blocks": self.num_disk_blocks_used,
            "disk_capacity_blocks": self.num_disk_blocks,
            "saved_blocks": self.num_saved_blocks,
            "loaded_blocks": self.num_loaded_blocks,
            "disk_loaded_blocks": self.num_disk_loaded_blocks,
            "spilled_blocks": self.num_spilled_blocks,
            "dropped_blocks": self.num_dropped_blocks,
        }

    def _evict_host(self, ops: list[TransferOp]) -> int:
        """Free the least recently used host slot, spilling its entry to disk if any."""
        key, entry = self._host.popitem(last=False)
        if self.num_disk_blocks:
            if len(self._disk) >= self.num_disk_blocks:
                old, _ = self._disk.popitem(last=False)
                ops.append(("drop_disk", old))
                self.num_dropped_blocks += 1
            ops.append(("spill", entry.slot, key))
            self._disk[key] = _Entry(entry.salt, entry.token_ids)
            self.num_spilled_blocks += 1
        else:
            self.num_dropped_blocks += 1
        return entry.slot
