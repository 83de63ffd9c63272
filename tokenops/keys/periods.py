"""Budget periods: ``daily`` (UTC days) and ``monthly`` (UTC calendar months) reset
at the period's end; ``<N>h`` is a rolling window over the last N hours, kept as
:data:`ROLLING_BUCKETS` buckets of N hours / 60 each (spend leaves the window a
bucket at a time, so the window is exact to 1/60 of its length).

A :class:`Window` lists the starts of the ledger buckets whose sum is the spend
that counts now (one for a fixed period); the last one is charged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

ROLLING_BUCKETS = 60
_HOURS = re.compile(r"^([1-9][0-9]{0,4})h$")


def check_period(period: str) -> str:
    """``period`` normalised, or ValueError saying what is accepted."""
    text = str(period).strip().lower()
    if text in ("daily", "monthly") or _HOURS.match(text):
        return text
    raise ValueError(
        f"budget_period must be 'daily', 'monthly' or '<N>h' (a rolling window of N = 1..99999 hours), got {period!r}"
    )


@dataclass(frozen=True, slots=True)
class Window:
    starts: tuple[float, ...]  # bucket starts summed, oldest first; the last is charged now
    bucket_s: float
    end: float | None  # a fixed period's end (its reset); None for a rolling window

    @property
    def is_rolling(self) -> bool:
        return self.end is None

    @property
    def length_s(self) -> float:
        return self.bucket_s * len(self.starts)

    def reset_at(self, values: list[float], limit: float) -> float:
        """When the spend that counts falls below ``limit`` again (``values`` per bucket)."""
        if self.end is not None:
            return self.end
        total = sum(values)
        for start, value in zip(self.starts, values):
            total -= value
            if total < limit:
                return start + self.length_s
        return self.starts[-1] + self.length_s


def window(period: str, now: float) -> Window:
    if period == "daily":
        start = (now // 86400) * 86400
        return Window((start,), 86400.0, start + 86400)
    if period == "monthly":
        t = datetime.fromtimestamp(now, UTC)
        first = datetime(t.year, t.month, 1, tzinfo=UTC).timestamp()
        following = datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=UTC).timestamp()
        return Window((first,), following - first, following)
    m = _HOURS.match(period)
    assert m, period
    bucket = int(m.group(1)) * 3600.0 / ROLLING_BUCKETS
    current = (now // bucket) * bucket
    return Window(tuple(current - i * bucket for i in range(ROLLING_BUCKETS - 1, -1, -1)), bucket, None)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
