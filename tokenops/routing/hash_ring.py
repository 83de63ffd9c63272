"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018).

Each replica owns ``num_vnodes`` points on a 64-bit ring. A key goes to the first
replica clockwise from its hash whose load is below the capacity
``ceil(load_factor * (total_load + 1) / num_replicas)``; so no replica carries more
than ``load_factor`` times the mean, and adding a replica moves only the keys
whose arc it takes over (about ``1/n``). Hashes are blake2b, stable across
processes, so several gateways map a session to the same replica.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Iterable


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """A ring over replica names; rebuilt cheaply when the set changes."""

    def __init__(self, names: Iterable[str], num_vnodes: int = 100) -> None:
        assert num_vnodes >= 1
        self.names = tuple(sorted(set(names)))
        self.num_vnodes = num_vnodes
        points = sorted((stable_hash(f"{name}#{v}"), name) for name in self.names for v in range(num_vnodes))
        self._hashes = [h for h, _ in points]
        self._owners = [n for _, n in points]

    def walk(self, key: str) -> Iterable[str]:
        """Distinct replica names clockwise from ``key``'s point."""
        if not self._hashes:
            return
        start = bisect.bisect(self._hashes, stable_hash(key))
        seen: set[str] = set()
        for i in range(len(self._hashes)):
            name = self._owners[(start + i) % len(self._hashes)]
            if name not in seen:
                seen.add(name)
                yield name
                if len(seen) == len(self.names):
                    return

    def lookup(self, key: str) -> str | None:
        """The owner of ``key`` ignoring load."""
        return next(iter(self.walk(key)), None)

    def lookup_bounded(self, key: str, load: Callable[[str], float], load_factor: float) -> str | None:
        """The first replica clockwise whose load is below the bounded-load capacity."""
        assert load_factor >= 1.0
        if not self.names:
            return None
        total = sum(load(n) for n in self.names)
        capacity = math.ceil(load_factor * (total + 1) / len(self.names))
        first = None
        for name in self.walk(key):
            first = first or name
            if load(name) < capacity:
                return name
        return first  # unreachable: some replica is always below the mean
