"""Arrival processes: when each request of a run is sent.

``poisson`` has exponential gaps; ``gamma`` generalises it with a burstiness
factor (shape): 1 is Poisson, < 1 burstier, > 1 smoother, always with mean gap
1/rate; ``constant`` sends at exact intervals. Fixed concurrency has no
schedule (the load generator keeps C requests in flight instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ARRIVALS = ("poisson", "constant", "gamma")


@dataclass(slots=True)
class ArrivalSpec:
    """How requests arrive: ``rate`` in requests/s (``inf`` sends everything at once)."""

    rate: float
    kind: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ARRIVALS:
            raise ValueError(f"unknown arrival process {self.kind!r}; use one of {', '.join(ARRIVALS)}")
        if not self.rate > 0:
            raise ValueError(f"request rate must be positive, got {self.rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be positive, got {self.burstiness}")

    def gaps(self, num_requests: int) -> np.ndarray:
        """Inter-arrival gaps in seconds; the first request goes at t=0."""
        assert num_requests >= 0
        if num_requests == 0:
            return np.zeros(0)
        if math.isinf(self.rate):
            return np.zeros(num_requests)
        rng = np.random.default_rng(self.seed)
        mean = 1.0 / self.rate
        if self.kind == "constant":
            g = np.full(num_requests, mean)
        elif self.kind == "poisson":
            g = rng.exponential(mean, num_requests)
        else:
            g = rng.gamma(self.burstiness, mean / self.burstiness, num_requests)
        g[0] = 0.0
        return g

    def offsets(self, num_requests: int) -> np.ndarray:
        """Send times in seconds from the start of the run."""
        return np.cumsum(self.gaps(num_requests))
