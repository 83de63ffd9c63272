"""Paged KV-cache block accounting: reference counts, prefix caching, LRU eviction.

Pure Python: the K/V tensors live in the model runner; this file only decides which
physical block holds which sequence positions.

Prefix caching: every *computed, full* block is registered under a chained hash of
``(parent block hash, tenant salt, token ids of the block)``, so a block can only be
reused by a sequence with the identical prefix from the same tenant. When a block's
reference count drops to zero it stays registered on an LRU list of free cached
blocks; a fresh allocation takes a never-cached free block first and otherwise
evicts the least recently freed cached one.

KV offload tier (optional ``offload``, an :class:`~tokenops.engine.kv.offload_index.OffloadIndex`):
an evicted cached block is copied to the tier under its hash, and a lookup that misses
in the pool but hits in the tier takes a fresh block and copies the tier's copy into
it instead of recomputing it. The copies are queued on ``pending_transfers`` in order;
the engine hands them to the model runner before the step's forward.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenops.engine.core.sequence import Sequence
    from tokenops.engine.kv.offload_index import OffloadIndex, TransferOp


class Block:
    """One physical KV block."""

    __slots__ = ("block_id", "ref_count", "block_hash", "token_ids", "salt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] | None = None
        self.salt: str | None = None


class BlockManager:
    """Allocates KV blocks to sequences (``block_table``) with copy-on-write forks."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, offload: OffloadIndex | None = None
    ) -> None:
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free_uncached: deque[int] = deque(range(num_blocks))
        #: Free blocks that still hold a registered prefix, least recently freed first.
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._hash_to_block: dict[int, int] = {}
        self.num_prefix_queries = 0  # prompt tokens looked up
        self.num_prefix_hits = 0  # of which served from the cache
        self.num_evictions = 0
        self.num_policy_evictions = 0  # blocks released by a KV policy (sink + window)
        self.offload = offload
        #: Offload-tier copies queued for the runner, in the order they must run.
        self.pending_transfers: list[TransferOp] = []
        self.num_offload_hits = 0  # prompt tokens loaded back from the offload tier

    # -- sizes --------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_to_block)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- hashing -----------------------------------------------------------------------

    def _block_tokens(self, seq: Sequence, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(seq.token_ids[start : start + self.block_size])

    def _hash_of(self, seq: Sequence, index: int) -> int:
        """Chained hash of the full block ``index`` of ``seq`` (memoised on the sequence)."""
        hashes = seq.block_hashes
        while len(hashes) <= index:
            i = len(hashes)
            parent = hashes[i - 1] if i else 0
            hashes.append(hash((parent, seq.cache_salt, self._block_tokens(seq, i))))
        return hashes[index]

    def _lookup(self, seq: Sequence) -> list[int | None]:
        """Cached blocks holding the longest prefix of ``seq`` (None: a block the offload
        tier holds); the last token is never a hit, because the step must compute it to
        get logits."""
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []  # a prompt whose logprobs are asked needs logits at every position: all computed
        hits: list[int | None] = []
        for i in range((len(seq.token_ids) - 1) // self.block_size):
            block_hash, tokens = self._hash_of(seq, i), self._block_tokens(seq, i)
            block_id = self._hash_to_block.get(block_hash)
            if block_id is None:
                if self.offload is not None and self.offload.contains(block_hash, seq.cache_salt, tokens):
                    hits.append(None)
                    continue
                break
            block = self.blocks[block_id]
            # guards against hash collisions: same tenant and same tokens
            if block.salt != seq.cache_salt or block.token_ids != tokens:
                break
            hits.append(block_id)
        return hits

    # -- allocation --------------------------------------------------------------------

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether blocks for all of ``seq``'s tokens can be had now."""
        pool_hits = [b for b in self._lookup(seq) if b is not None]
        num_hits_free = sum(1 for b in pool_hits if self.blocks[b].ref_count == 0)
        num_fresh = self.num_blocks_for(len(seq.token_ids)) - len(pool_hits)
        return num_fresh <= self.num_free_blocks - num_hits_free

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` blocks for all its tokens, reusing cached prefix blocks; sets
        ``num_computed_tokens``/``num_cached_tokens`` to the tokens served from the cache."""
        assert not seq.block_table, f"{seq} already holds blocks"
        assert self.can_allocate(seq)
        hits = self._lookup(seq)
        for block_id in hits:
            if block_id is not None:
                self._ref(block_id)
        # claimed before any fresh block is taken: the saves of the blocks that evicts
        # must not push these out of the tier
        # (a hit of None, a block to load back, comes only from the offload tier)
        offload = self.offload
        claims = (
            {i: offload.claim(self._hash_of(seq, i)) for i, b in enumerate(hits) if b is None}
            if offload is not None
            else {}
        )
        table = [b if b is not None else self._take_fresh() for b in hits]
        for i, entry in claims.items():
            assert offload is not None  # the claims came from it
            self._register(self.blocks[table[i]], seq, i)
            offload.load(self._hash_of(seq, i), entry, table[i], self.pending_transfers)
        seq.block_table = table + [
            self._take_fresh() for _ in range(self.num_blocks_for(len(seq.token_ids)) - len(hits))
        ]
        seq.num_computed_tokens = len(hits) * self.block_size
        self.num_offload_hits += len(claims) * self.block_size
        if seq.num_output_tokens == 0:  # a recompute after preemption is not a prompt-cache hit
            seq.num_cached_tokens = seq.num_computed_tokens
        if self.enable_prefix_caching:
            self.num_prefix_queries += len(seq.token_ids)
            self.num_prefix_hits += seq.num_cached_tokens

    def _slot_needs(self, seq: Sequence) -> tuple[bool, bool]:
        """(needs a new block, needs a copy of its shared last block) before computing
        the position ``len(seq) - 1``."""
        table = seq.block_table
        if len(seq.token_ids) > len(table) * self.block_size:
            return True, False
        return False, self.blocks[table[-1]].ref_count > 1

    def can_append(self, seq: Sequence) -> bool:
        """Whether ``seq``'s next token has a writable slot (or a free block for one)."""
        is_new, is_copy = self._slot_needs(seq)
        return not (is_new or is_copy) or self.num_free_blocks > 0

    def append_slot(self, seq: Sequence) -> list[tuple[int, int]]:
        """Make the slot of the last token writable; returns ``(src, dst)`` block copies
        the runner must make first (copy-on-write of a block shared by a fork)."""
        assert len(seq.token_ids) <= (len(seq.block_table) + 1) * self.block_size
        is_new, is_copy = self._slot_needs(seq)
        if is_new:
            seq.block_table.append(self._take_fresh())
        elif is_copy:
            src = seq.block_table[-1]
            dst = self._take_fresh()
            self._deref(src)
            seq.block_table[-1] = dst
            return [(src, dst)]
        return []

    def reserve_slots(self, seq: Sequence, num_extra: int, num_kept_free: int = 0) -> int:
        """Speculative decoding: extend ``seq``'s table so ``num_extra`` positions past its
        last token have slots, leaving at least ``num_kept_free`` blocks free; returns how
        many extra positions got slots (``num_extra`` or fewer). Undo with :meth:`trim`."""
        assert num_extra >= 0
        num_tokens = len(seq.token_ids)
        assert len(seq.block_table) >= self.num_blocks_for(num_tokens), "append_slot first"
        while num_extra > 0:
            num_new = self.num_blocks_for(num_tokens + num_extra) - len(seq.block_table)
            if num_new <= max(0, self.num_free_blocks - num_kept_free):
                for _ in range(max(0, num_new)):
                    seq.block_table.append(self._take_fresh())
                break
            num_extra -= 1
        return num_extra

    def trim(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Free the blocks past the first ``num_tokens`` positions (default: all of
        ``seq``'s tokens), e.g. the slots of rejected speculative tokens."""
        keep = self.num_blocks_for(len(seq.token_ids) if num_tokens is None else num_tokens)
        while len(seq.block_table) > keep:
            self._deref(seq.block_table.pop())

    def evict(self, seq: Sequence, index: int) -> None:
        """KV policy (sink + window): release block ``index`` of ``seq``'s table; the
        entry becomes -1 and attention masks its positions. Never the last block."""
        assert 0 <= index < len(seq.block_table) - 1 and seq.block_table[index] >= 0, (index, seq)
        self._deref(seq.block_table[index])
        seq.block_table[index] = -1
        self.num_policy_evictions += 1

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let ``child`` share every block of ``parent``; a later write to the shared
        partial block copies it (see :meth:`append_slot`)."""
        assert not child.block_table
        for block_id in parent.block_table:
            if block_id >= 0:
                self._ref(block_id)
        child.block_table = list(parent.block_table)

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks; registered ones stay reusable until evicted."""
        # tail blocks are the least likely to be shared, so they are freed (and evicted) first
        for block_id in reversed(seq.block_table):
            if block_id >= 0:  # -1: evicted by a KV policy
                self._deref(block_id)
        seq.block_table = []

    def cache_computed_blocks(self, seq: Sequence, num_computed_before: int) -> None:
        """Register the blocks that became full and computed since ``num_computed_before``."""
        if not self.enable_prefix_caching:
            return
        first = num_computed_before // self.block_size
        for i in range(first, seq.num_computed_tokens // self.block_size):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is not None:
                continue  # a prefix-cache hit, already registered
            if self._hash_of(seq, i) in self._hash_to_block:
                continue  # same content computed twice; keep the first copy registered
            self._register(block, seq, i)

    def take_transfers(self) -> list[TransferOp]:
        """The queued offload-tier copies (emptied); run them in order before the forward."""
        ops, self.pending_transfers = self.pending_transfers, []
        return ops

    def reset_prefix_cache(self) -> int:
        """Forget every free cached block (used ones keep working) and the offload tier;
        returns how many blocks of the pool and the tier were forgotten."""
        num = len(self._free_cached)
        while self._free_cached:
            block_id, _ = self._free_cached.popitem(last=False)
            self._unregister(self.blocks[block_id])
            self._free_uncached.append(block_id)
        if self.offload is not None:
            num += self.offload.clear(self.pending_transfers)
        return num

    # -- internals ---------------------------------------------------------------------

    def _take_fresh(self) -> int:
        if self._free_uncached:
            block_id = self._free_uncached.popleft()
        else:
            assert self._free_cached, "no free KV block: check can_allocate/can_append first"
            block_id, _ = self._free_cached.popitem(last=False)
            block = self.blocks[block_id]
            if self.offload is not None:
                assert block.block_hash is not None and block.token_ids is not None  # a cached block is registered
                self.offload.save(block.block_hash, block.salt, block.token_ids, block_id, self.pending_transfers)
            self._unregister(block)
            self.num_evictions += 1
        block = self.blocks[block_id]
        assert block.ref_count == 0
        block.ref_count = 1
        return block_id

    def _register(self, block: Block, seq: Sequence, index: int) -> None:
        block.block_hash = self._hash_of(seq, index)
        block.token_ids = self._block_tokens(seq, index)
        block.salt = seq.cache_salt
        self._hash_to_block[block.block_hash] = block.block_id

    def _unregister(self, block: Block) -> None:
        assert block.block_hash is not None
        del self._hash_to_block[block.block_hash]
        block.block_hash = block.token_ids = block.salt = None

    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            assert block.block_hash is not None, "only cached blocks are revived"
            del self._free_cached[block_id]
        block.ref_count += 1

    def _deref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.block_hash is not None:
                self._free_cached[block_id] = None
            else:
                self._free_uncached.append(block_id)

    def check_invariants(self, block_tables: Iterable[list[int]]) -> None:
        """Assert the accounting matches ``block_tables`` (every live sequence's table)."""
        holders = [0] * self.num_blocks
        for table in block_tables:
            for block_id in table:
                if block_id >= 0:
                    holders[block_id] += 1
        free_uncached, free_cached = set(self._free_uncached), set(self._free_cached)
        assert len(free_uncached) == len(self._free_uncached), "duplicate free block"
        assert not free_uncached & free_cached
        for block in self.blocks:
            assert block.ref_count == holders[block.block_id], f"block {block.block_id} ref count"
            is_free = block.block_id in free_uncached or block.block_id in free_cached
            assert is_free == (block.ref_count == 0), f"block {block.block_id} free list"
            if block.block_id in free_cached:
                assert block.block_hash is not None
            if block.block_id in free_uncached:
                assert block.block_hash is None
            if block.block_hash is not None:
                assert self._hash_to_block[block.block_hash] == block.block_id
                assert block.token_ids is not None and len(block.token_ids) == self.block_size
        for block_hash, block_id in self._hash_to_block.items():
            assert self.blocks[block_id].block_hash == block_hash
