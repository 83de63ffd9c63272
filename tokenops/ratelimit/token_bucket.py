"""Token-bucket arithmetic shared by the in-process and Redis stores.

A bucket refills at ``rate_per_s`` up to ``capacity``. Taking more than is there is
refused with the time until enough has refilled. A charge larger than the whole
capacity is allowed once the bucket is full and leaves it in debt, so one huge
request is slowed down rather than refused forever. Corrections after the fact
(:meth:`TokenBucket.adjust`) refund or add debt.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    rate_per_s: float
    capacity: float
    level: float = -1.0  # -1: start full
    updated: float = 0.0

    def __post_init__(self) -> None:
        assert self.rate_per_s > 0 and self.capacity > 0
        if self.level < 0:
            self.level = self.capacity

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate_per_s)
        self.updated = max(self.updated, now)

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` can be taken (0 when it can be now)."""
        self.refill(now)
        need = min(amount, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate_per_s

    def take(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level -= amount

    def adjust(self, delta: float, now: float) -> None:
        """Give back (positive) or charge more (negative) after the real cost is known."""
        self.refill(now)
        self.level = min(self.capacity, self.level + delta)
