"""In-flight load per replica: requests and tokens (prompt + expected decode).

Selection calls :meth:`LoadTracker.start`; the end of a backend call is reported
by ``tokenops_backend_outcome(backend, outcome)``, which names the replica but not
the request, so :meth:`finish` retires the in-flight entry of that replica whose
prompt estimate is closest to the reported prompt tokens (oldest on ties). Entries
whose outcome never arrives expire after ``stale_after_s``.

It also keeps the tokens *recently given* to each replica, decayed with a
half-life of ``recent_half_life_s``: affinity routers balance on it as well as on
what is in flight, so a replica that keeps winning on cache affinity between
bursts still counts as loaded.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _InFlight:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    started: float

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


class LoadTracker:
    """Outstanding requests and tokens per replica name."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        stale_after_s: float = 900.0,
        recent_half_life_s: float = 30.0,
    ) -> None:
        assert stale_after_s > 0 and recent_half_life_s > 0
        self.clock = clock
        self.stale_after_s = stale_after_s
        self.recent_half_life_s = recent_half_life_s
        self._recent: dict[str, tuple[float, float]] = {}  # replica -> (decayed tokens, at)
        self._in_flight: dict[str, list[_InFlight]] = {}
        self._tokens: dict[str, int] = {}
        #: cumulative tokens (prompt + completion) each replica has been given
        self.served_tokens: dict[str, int] = {}
        self._lock = threading.Lock()

    def start(self, replica: str, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        with self._lock:
            entry = _InFlight(request_id, prompt_tokens, max_tokens, self.clock())
            self._in_flight.setdefault(replica, []).append(entry)
            self._tokens[replica] = self._tokens.get(replica, 0) + entry.num_tokens
            self._recent[replica] = (self._decayed(replica, entry.started) + entry.num_tokens, entry.started)

    def _decayed(self, replica: str, now: float) -> float:
        value, at = self._recent.get(replica, (0.0, now))
        return value * math.exp(-math.log(2) * max(0.0, now - at) / self.recent_half_life_s)

    def recent_tokens(self, replica: str) -> float:
        """Tokens given to ``replica`` lately (exponentially decayed)."""
        with self._lock:
            return self._decayed(replica, self.clock())

    def finish(self, replica: str, prompt_tokens: int | None = None, completion_tokens: int = 0) -> bool:
        """Retire one in-flight request of ``replica``; False when none was tracked."""
        with self._lock:
            self._expire(replica)
            entries = self._in_flight.get(replica)
            if not entries:
                return False
            index = 0
            if prompt_tokens:
                index = min(range(len(entries)), key=lambda i: (abs(entries[i].prompt_tokens - prompt_tokens), i))
            entry = entries.pop(index)
            self._tokens[replica] -= entry.num_tokens
            served = (prompt_tokens or entry.prompt_tokens) + completion_tokens
            self.served_tokens[replica] = self.served_tokens.get(replica, 0) + served
            return True

    def _expire(self, replica: str) -> None:
        entries = self._in_flight.get(replica)
        if not entries:
            return
        cutoff = self.clock() - self.stale_after_s
        while entries and entries[0].started < cutoff:
            self._tokens[replica] -= entries.pop(0).num_tokens

    def outstanding_tokens(self, replica: str) -> int:
        with self._lock:
            self._expire(replica)
            return self._tokens.get(replica, 0)

    def num_in_flight(self, replica: str) -> int:
        with self._lock:
            self._expire(replica)
            return len(self._in_flight.get(replica, ()))

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{replica: {"in_flight": n, "tokens": t}}`` for stats and tests."""
        with self._lock:
            return {r: {"in_flight": len(e), "tokens": self._tokens.get(r, 0)} for r, e in self._in_flight.items()}

    def reset(self) -> None:
        with self._lock:
            self._in_flight.clear()
            self._tokens.clear()
            self._recent.clear()
            self.served_tokens.clear()
