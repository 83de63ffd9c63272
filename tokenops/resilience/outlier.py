"""Latency-outlier ejection: a replica much slower than its peers is taken out for a while.

Each replica keeps an exponentially weighted mean of seconds per token
(``latency / (completion tokens + 1)``, so long answers are not penalised).
With at least ``min_samples`` on it and two peers measured, a replica whose mean
exceeds ``factor`` times the median of its peers is ejected for ``ejection_s``,
but never more than ``max_ejected_fraction`` of the replicas at once.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class OutlierConfig:
    factor: float = 3.0
    min_samples: int = 10
    alpha: float = 0.2
    ejection_s: float = 30.0
    max_ejected_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.factor <= 1.0 or not 0.0 < self.alpha <= 1.0 or self.ejection_s <= 0:
            raise ValueError("outlier ejection: factor must be > 1, alpha in (0, 1], ejection_s > 0")
        if not 0.0 <= self.max_ejected_fraction < 1.0:
            raise ValueError("outlier ejection: max_ejected_fraction must be in [0, 1)")


class OutlierDetector:
    def __init__(self, config: OutlierConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self._mean: dict[str, float] = {}
        self._num_samples: dict[str, int] = {}
        self._ejected_until: dict[str, float] = {}
        self._known: set[str] = set()

    def record(self, replica: str, latency_s: float, num_tokens: int) -> None:
        self._known.add(replica)
        per_token = latency_s / (num_tokens + 1)
        old = self._mean.get(replica)
        self._mean[replica] = per_token if old is None else old + self.config.alpha * (per_token - old)
        self._num_samples[replica] = self._num_samples.get(replica, 0) + 1
        self._check(replica)

    def _check(self, replica: str) -> None:
        if self._num_samples[replica] < self.config.min_samples or self.is_ejected(replica):
            return
        peers = [m for r, m in self._mean.items() if r != replica and self._num_samples[r] >= self.config.min_samples]
        if len(peers) < 2:
            return
        if self._mean[replica] > self.config.factor * statistics.median(peers):
            num_ejected = sum(1 for r in self._known if self.is_ejected(r))
            if num_ejected + 1 <= self.config.max_ejected_fraction * len(self._known):
                self._ejected_until[replica] = self.clock() + self.config.ejection_s
                # back on probation: it must prove itself again after the ejection
                self._num_samples[replica] = 0
                self._mean.pop(replica)

    def is_ejected(self, replica: str) -> bool:
        until = self._ejected_until.get(replica)
        if until is None:
            return False
        if self.clock() >= until:
            del self._ejected_until[replica]
            return False
        return True
