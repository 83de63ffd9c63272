"""Weighted fair share of a global token capacity across tenants.

A global bucket holds the gateway's total tokens/min. A tenant is admitted while
its recent token rate (an exponentially decayed sum over ``window_s``) is within
its share, ``rate * weight / sum(weights of active tenants)``, leaving in the
bucket a reserve that grows with how much of its share it uses (so under
contention the tenants' usage-to-share ratios even out). Over its share it
may only borrow capacity the others leave unused (the bucket is more than half
full), the borrower furthest behind by weighted usage (virtual time) first;
so a flood from one tenant cannot starve the light ones, and the heavy tenant
still gets whatever capacity the others leave unused (work-conserving).
"""

from __future__ import annotations

import math
import threading

from tokenops.ratelimit.token_bucket import TokenBucket

#: Fraction of the global burst kept for tenants under their share once contended.
CONTENDED_BELOW = 0.5


class FairShare:
    def __init__(
        self,
        tokens_per_min: float,
        weights: dict[str, float] | None = None,
        window_s: float = 60.0,
        burst_s: float = 6.0,
    ) -> None:
        assert tokens_per_min > 0 and window_s > 0 and burst_s > 0
        self.rate_per_s = tokens_per_min / 60.0
        self.weights = dict(weights or {})
        self.window_s = window_s
        self.bucket = TokenBucket(self.rate_per_s, self.rate_per_s * burst_s, updated=0.0)
        self._usage: dict[str, tuple[float, float]] = {}  # tenant -> (decayed tokens, at)
        self._lock = threading.Lock()
        self._started = False

    def _decayed(self, tenant: str, now: float) -> float:
        value, at = self._usage.get(tenant, (0.0, now))
        return value * math.exp(-max(0.0, now - at) / self.window_s)

    def _active(self, now: float) -> set[str]:
        return {t for t in self._usage if self._decayed(t, now) / self.window_s > 0.01 * self.rate_per_s}

    def _share(self, tenant: str, now: float) -> float:
        active = self._active(now) | {tenant}
        total = sum(self.weights.get(t, 1.0) for t in active)
        return self.rate_per_s * self.weights.get(tenant, 1.0) / total

    def wait_for(self, tenant: str, tokens: float, now: float) -> float:
        """Seconds before ``tenant`` may spend ``tokens`` (0: now)."""
        with self._lock:
            if not self._started:
                self.bucket.updated, self._started = now, True
            wait = self.bucket.wait_for(tokens, now)
            if wait > 0:
                return wait
            share = self._share(tenant, now)
            rate = (self._decayed(tenant, now) + tokens) / self.window_s
            reserve = CONTENDED_BELOW * self.bucket.capacity
            if rate <= share:
                # the closer a tenant is to its share, the more of the bucket it leaves to others
                if self.bucket.level - tokens >= reserve * rate / share:
                    return 0.0
                return max(1e-3, (tokens + reserve * rate / share - self.bucket.level) / self.rate_per_s)
            # over its share: it may only borrow capacity others leave unused (the bucket is
            # more than half full), and among borrowers the one furthest behind goes first
            if self.bucket.level - tokens >= reserve:
                mine = self._decayed(tenant, now) / self.weights.get(tenant, 1.0)
                others = [
                    self._decayed(t, now) / self.weights.get(t, 1.0)
                    for t in self._active(now)
                    if t != tenant and self._decayed(t, now) / self.window_s > self._share(t, now)
                ]
                if not others or mine <= min(others):
                    return 0.0
            # time for the decayed usage to fall back to the share
            return max(1e-3, self.window_s * math.log(rate / share))

    def take(self, tenant: str, tokens: float, now: float) -> None:
        with self._lock:
            self.bucket.take(tokens, now)
            self._usage[tenant] = (self._decayed(tenant, now) + tokens, now)

    def adjust(self, tenant: str, delta: float, now: float) -> None:
        """``delta`` > 0 gives back over-estimated tokens; < 0 charges the excess."""
        with self._lock:
            self.bucket.adjust(delta, now)
            self._usage[tenant] = (max(0.0, self._decayed(tenant, now) - delta), now)
