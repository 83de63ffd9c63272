"""Retrying a request on another replica when its replica failed before answering.

Which failures: the replica could not be reached, or answered 5xx/429 before the
first byte reached the client (a streamed request is retried only while nothing
has been sent; a non-streamed one had nothing sent by definition). Timeouts are
not retried (the replica may still be working on it), nor client errors.

How many: at most ``max_attempts`` replicas per request, and within a
**retry budget** (as in Finagle and Envoy): over the last ``window_s`` seconds,
retries may add at most ``ratio`` of the requests plus ``min_per_s`` per second.
When every replica is failing the budget stops retries from multiplying the load
on them; while one is healthy, a killed peer costs latency, not errors.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenops.config import GatewaySettings

#: BackendError kinds that say "this replica did not answer", never "this request is bad".
RETRYABLE_KINDS = frozenset({"unavailable", "error", "overload"})


def is_retryable(error: BaseException) -> bool:
    kind = getattr(error, "kind", None)
    status = getattr(error, "status", 0) or 0
    return kind in RETRYABLE_KINDS and (status >= 500 or status == 429 or kind == "unavailable")


@dataclass(slots=True)
class RetryConfig:
    max_attempts: int = 3
    ratio: float = 0.2
    min_per_s: float = 5.0
    window_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("retry: max_attempts must be >= 1 (1 = no retries)")
        if not (0.0 <= self.ratio <= 10.0) or not (0.0 <= self.min_per_s <= 1e6) or not self.window_s > 0:
            raise ValueError("retry: ratio in [0, 10], min_per_s >= 0 and window_s > 0")


class RetryBudget:
    """Counts requests and retries in a sliding window; :meth:`try_spend` says whether one more retry fits."""

    def __init__(self, config: RetryConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or RetryConfig()
        self.clock = clock
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()
        self._lock = threading.Lock()
        self.num_retries = 0
        self.num_refused = 0

    def _trim(self, now: float) -> None:
        cutoff = now - self.config.window_s
        for q in (self._requests, self._retries):
            while q and q[0] < cutoff:
                q.popleft()

    def on_request(self) -> None:
        now = self.clock()
        with self._lock:
            self._requests.append(now)
            self._trim(now)

    def try_spend(self) -> bool:
        """Take one retry from the budget if it has one."""
        now = self.clock()
        with self._lock:
            self._trim(now)
            allowed = self.config.ratio * len(self._requests) + self.config.min_per_s * self.config.window_s
            if len(self._retries) + 1 > allowed:
                self.num_refused += 1
                return False
            self._retries.append(now)
            self.num_retries += 1
            return True

    def stats(self) -> dict[str, int]:
        return {"retries": self.num_retries, "retries_refused_by_budget": self.num_refused}


def retry_budget(gateway: GatewaySettings) -> RetryBudget:
    """The budget configured by ``[gateway] retry_*`` (a ConfigError when out of range)."""
    try:
        return RetryBudget(
            RetryConfig(
                max_attempts=gateway.retry_max_attempts,
                ratio=gateway.retry_budget_ratio,
                min_per_s=gateway.retry_budget_min_per_s,
            )
        )
    except ValueError as e:
        from tokenops.config import ConfigError

        raise ConfigError(f"[gateway] {e}") from None
