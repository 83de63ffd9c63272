"""An approximate prefix tree of what each replica has cached.

A prompt is cut into fixed-size blocks (characters of the rendered prompt, or token
ids) and each block is named by a chained hash of ``(parent hash, block)``, so a
hash stands for the whole prefix ending at that block: the map ``hash -> replicas``
is a radix tree flattened into a dict. Each replica keeps its hashes in LRU order
and forgets the oldest beyond ``max_blocks``, mirroring the engine's LRU eviction
of free cached blocks. It is approximate: the gateway only sees what it sent, not
what the engine actually evicted.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence


def chained_hashes(blocks: Iterable[Hashable], salt: Hashable = None) -> list[int]:
    """One hash per block, each covering every block before it (and the salt)."""
    out: list[int] = []
    parent = hash(("tokenops-prefix", salt))
    for block in blocks:
        parent = hash((parent, block))
        out.append(parent)
    return out


def blocks_of(seq: Sequence, block_size: int, full_only: bool = True) -> list[Sequence]:
    """Cut ``seq`` into ``block_size`` pieces; the partial tail is dropped when
    ``full_only`` (engines cache only full blocks)."""
    assert block_size >= 1
    end = len(seq) - len(seq) % block_size if full_only else len(seq)
    return [seq[i : i + block_size] for i in range(0, end, block_size)]


class PrefixIndex:
    """Which replica holds which prefix blocks, bounded per replica with LRU eviction."""

    def __init__(self, max_blocks: int = 4096) -> None:
        assert max_blocks >= 1
        self.max_blocks = max_blocks
        self._holders: dict[int, set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self._lock = threading.Lock()

    def set_capacity(self, replica: str, max_blocks: int) -> None:
        """Bound one replica by its own cache size (e.g. the engine's KV blocks)."""
        assert max_blocks >= 1
        with self._lock:
            self._capacity[replica] = max_blocks
            self._evict(replica)

    def match(self, hashes: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``hashes`` each of ``replicas`` holds."""
        with self._lock:
            matched = {r: 0 for r in replicas}
            alive = set(matched)
            for i, h in enumerate(hashes):
                holders = self._holders.get(h)
                alive = alive & holders if holders else set()
                if not alive:
                    break
                for r in alive:
                    matched[r] = i + 1
            return matched

    def insert(self, replica: str, hashes: Sequence[int]) -> None:
        """Record that ``replica`` now holds these blocks (most recently used)."""
        with self._lock:
            lru = self._lru.setdefault(replica, OrderedDict())
            for h in hashes:
                if h in lru:
                    lru.move_to_end(h)
                else:
                    lru[h] = None
                    self._holders.setdefault(h, set()).add(replica)
            self._evict(replica)

    def _evict(self, replica: str) -> None:
        lru = self._lru.get(replica)
        if lru is None:
            return
        limit = self._capacity.get(replica, self.max_blocks)
        while len(lru) > limit:
            h, _ = lru.popitem(last=False)
            holders = self._holders[h]
            holders.discard(replica)
            if not holders:
                del self._holders[h]

    def num_blocks(self, replica: str) -> int:
        with self._lock:
            return len(self._lru.get(replica, ()))

    def remove_replica(self, replica: str) -> None:
        """Forget a replica (it restarted or left): its cache is gone."""
        with self._lock:
            for h in self._lru.pop(replica, {}):
                holders = self._holders[h]
                holders.discard(replica)
                if not holders:
                    del self._holders[h]

    def clear(self) -> None:
        with self._lock:
            self._holders.clear()
            self._lru.clear()
