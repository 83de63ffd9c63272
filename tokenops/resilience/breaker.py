"""A circuit breaker for one replica.

``closed``: calls flow; outcomes go into a sliding window of ``window_s`` seconds.
It opens when, with at least ``min_calls`` in the window, the failure rate reaches
``failure_rate``, or at once after ``consecutive_failures`` failures in a row (a
killed replica trips within a few calls rather than after a window's worth).
``open``: no calls for ``cooldown_s`` (doubled on every failed trial, up to
``max_cooldown_s``). ``half_open``: up to ``num_trial_calls`` calls go through;
that many successes close it, one failure opens it again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(slots=True)
class BreakerConfig:
    window_s: float = 10.0
    min_calls: int = 5
    failure_rate: float = 0.5
    consecutive_failures: int = 3
    cooldown_s: float = 5.0
    max_cooldown_s: float = 60.0
    num_trial_calls: int = 2

    def __post_init__(self) -> None:
        if not 0.0 < self.failure_rate <= 1.0:
            raise ValueError(f"circuit_breaker: failure_rate must be in (0, 1], got {self.failure_rate}")
        if self.window_s <= 0 or self.cooldown_s <= 0 or self.max_cooldown_s < self.cooldown_s:
            raise ValueError("circuit_breaker: window_s, cooldown_s > 0 and max_cooldown_s >= cooldown_s")
        if self.min_calls < 1 or self.consecutive_failures < 1 or self.num_trial_calls < 1:
            raise ValueError("circuit_breaker: min_calls, consecutive_failures and num_trial_calls must be >= 1")


class CircuitBreaker:
    def __init__(self, config: BreakerConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.state = CLOSED
        self._window: deque[tuple[float, bool]] = deque()
        self._num_failures_in_row = 0
        self._opened_at = 0.0
        self._cooldown_s = config.cooldown_s
        self._num_trials_started = 0
        self._num_trial_successes = 0
        self.num_trips = 0

    def _refresh(self, now: float) -> None:
        if self.state == OPEN and now - self._opened_at >= self._cooldown_s:
            self.state = HALF_OPEN
            self._num_trials_started = self._num_trial_successes = 0
        cutoff = now - self.config.window_s
        while self._window and self._window[0][0] < cutoff:
            self._window.popleft()

    def current_state(self) -> str:
        self._refresh(self.clock())
        return self.state

    def can_call(self) -> bool:
        """Whether a call may go to this replica now (does not reserve a trial)."""
        self._refresh(self.clock())
        if self.state == CLOSED:
            return True
        if self.state == HALF_OPEN:
            return self._num_trials_started < self.config.num_trial_calls
        return False

    def on_call(self) -> None:
        """A call was sent: in half-open it uses up one trial."""
        if self.current_state() == HALF_OPEN:
            self._num_trials_started += 1

    def record(self, ok: bool) -> None:
        now = self.clock()
        self._refresh(now)
        if self.state == HALF_OPEN:
            if not ok:
                self._trip(now, backoff=True)
                return
            self._num_trial_successes += 1
            if self._num_trial_successes >= self.config.num_trial_calls:
                self.state = CLOSED
                self._cooldown_s = self.config.cooldown_s
                self._window.clear()
                self._num_failures_in_row = 0
            return
        if self.state == OPEN:
            return  # a call that started before the trip
        self._window.append((now, ok))
        self._num_failures_in_row = 0 if ok else self._num_failures_in_row + 1
        num_failed = sum(1 for _, good in self._window if not good)
        if self._num_failures_in_row >= self.config.consecutive_failures or (
            len(self._window) >= self.config.min_calls and num_failed / len(self._window) >= self.config.failure_rate
        ):
            self._trip(now, backoff=False)

    def force_open(self) -> None:
        """A health probe failed: open now (no backoff growth)."""
        if self.current_state() != OPEN:
            self._trip(self.clock(), backoff=False)

    def _trip(self, now: float, backoff: bool) -> None:
        if backoff:
            self._cooldown_s = min(self.config.max_cooldown_s, self._cooldown_s * 2)
        self.state = OPEN
        self._opened_at = now
        self._window.clear()
        self._num_failures_in_row = 0
        self.num_trips += 1
