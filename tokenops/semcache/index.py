"""A vector index for unit vectors: exact (flat) while small, inverted lists when large.

Measured on a 2-core box (tests/benchmarks/semantic_cache.py): a flat numpy scan of
100,000 x 384 float32 rows costs tens of milliseconds per query (it is memory bound),
far over a 5 ms budget, so beyond ``ivf_min_size`` entries the index partitions the
vectors into ``~sqrt(n)`` cells around centroids (k-means on a sample) and a query
scans only the ``nprobe`` nearest cells. Near-duplicates, the only matches a cache
serves, sit in the same or a neighbouring cell, so recall at the cache's similarity
threshold stays high (the benchmark reports it). Cells are rebuilt when the index
has grown 4x since the last build.
"""

from __future__ import annotations

import math
import threading

import numpy as np


class _Cell:
    __slots__ = ("vectors", "keys", "size")

    def __init__(self, dim: int, capacity: int = 16) -> None:
        self.vectors = np.zeros((capacity, dim), dtype=np.float32)
        self.keys = np.zeros(capacity, dtype=np.int64)
        self.size = 0

    def append(self, key: int, vector: np.ndarray) -> int:
        if self.size == len(self.keys):
            grow = max(16, len(self.keys))
            self.vectors = np.concatenate([self.vectors, np.zeros((grow, self.vectors.shape[1]), np.float32)])
            self.keys = np.concatenate([self.keys, np.zeros(grow, np.int64)])
        self.vectors[self.size] = vector
        self.keys[self.size] = key
        self.size += 1
        return self.size - 1

    def remove_at(self, pos: int) -> int | None:
        """Swap-remove; returns the key that moved into ``pos`` (or None)."""
        last = self.size - 1
        moved = None
        if pos != last:
            self.vectors[pos] = self.vectors[last]
            self.keys[pos] = self.keys[last]
            moved = int(self.keys[pos])
        self.size -= 1
        return moved


class VectorIndex:
    """Add, remove and search unit vectors by integer key."""

    def __init__(self, dim: int, nprobe: int = 16, ivf_min_size: int = 4096, seed: int = 0) -> None:
        assert dim >= 1 and nprobe >= 1 and ivf_min_size >= 64
        self.dim = dim
        self.nprobe = nprobe
        self.ivf_min_size = ivf_min_size
        self._rng = np.random.default_rng(seed)
        self._centroids: np.ndarray | None = None
        self._cells = [_Cell(dim)]
        self._where: dict[int, tuple[int, int]] = {}
        self._built_at = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._where)

    @property
    def num_cells(self) -> int:
        return len(self._cells)

    def add(self, key: int, vector: np.ndarray) -> None:
        vector = np.asarray(vector, dtype=np.float32).reshape(self.dim)
        with self._lock:
            if key in self._where:
                self._remove(key)
            cell = 0 if self._centroids is None else int(np.argmax(self._centroids @ vector))
            self._where[key] = (cell, self._cells[cell].append(key, vector))
            n = len(self._where)
            if n >= self.ivf_min_size and n >= 4 * self._built_at:
                self._build()

    def remove(self, key: int) -> bool:
        with self._lock:
            return self._remove(key)

    def _remove(self, key: int) -> bool:
        where = self._where.pop(key, None)
        if where is None:
            return False
        cell, pos = where
        moved = self._cells[cell].remove_at(pos)
        if moved is not None:
            self._where[moved] = (cell, pos)
        return True

    def search(self, vector: np.ndarray, k: int = 4) -> list[tuple[int, float]]:
        """Up to ``k`` ``(key, cosine)`` pairs, best first."""
        vector = np.asarray(vector, dtype=np.float32).reshape(self.dim)
        with self._lock:
            if self._centroids is None:
                cells = [self._cells[0]]
            else:
                scores = self._centroids @ vector
                nprobe = min(self.nprobe, len(scores))
                cells = [self._cells[i] for i in np.argpartition(-scores, nprobe - 1)[:nprobe]]
            sims = [cell.vectors[: cell.size] @ vector for cell in cells if cell.size]
            keys = [cell.keys[: cell.size] for cell in cells if cell.size]
        if not sims:
            return []
        all_sims = np.concatenate(sims) if len(sims) > 1 else sims[0]
        all_keys = np.concatenate(keys) if len(keys) > 1 else keys[0]
        top = np.argpartition(-all_sims, k - 1)[:k] if len(all_sims) > k else np.arange(len(all_sims))
        top = top[np.argsort(-all_sims[top])]
        return [(int(all_keys[i]), float(all_sims[i])) for i in top]

    def _build(self) -> None:
        """(Re)partition into ~sqrt(n) cells: k-means (3 rounds) on a sample, then assign all."""
        keys = np.fromiter(self._where, dtype=np.int64)
        vectors = np.concatenate([c.vectors[: c.size] for c in self._cells])
        order = np.concatenate([c.keys[: c.size] for c in self._cells])
        num_cells = max(16, int(math.sqrt(len(keys))))
        sample = vectors[self._rng.choice(len(vectors), size=min(len(vectors), 32 * num_cells), replace=False)]
        centroids = sample[self._rng.choice(len(sample), size=num_cells, replace=False)].copy()
        for _ in range(3):
            assign = np.argmax(sample @ centroids.T, axis=1)
            for c in range(num_cells):
                members = sample[assign == c]
                if len(members):
                    mean = members.sum(axis=0)
                    norm = np.linalg.norm(mean)
                    if norm > 0:
                        centroids[c] = mean / norm
        assign = np.concatenate(
            [np.argmax(chunk @ centroids.T, axis=1) for chunk in np.array_split(vectors, max(1, len(vectors) // 8192))]
        )
        cells = [_Cell(self.dim, 16) for _ in range(num_cells)]
        where: dict[int, tuple[int, int]] = {}
        for c in range(num_cells):
            idx = np.nonzero(assign == c)[0]
            cell = cells[c]
            cell.vectors = np.ascontiguousarray(vectors[idx]) if len(idx) else cell.vectors
            cell.keys = order[idx].copy() if len(idx) else cell.keys
            cell.size = len(idx)
            for pos, key in enumerate(cell.keys[: cell.size].tolist()):
                where[key] = (c, pos)
        assert len(where) == len(keys)
        self._centroids, self._cells, self._where = centroids.astype(np.float32), cells, where
        self._built_at = len(keys)
