"""Budget periods: ``daily`` (UTC days), ``monthly`` (UTC calendar months) or
``<N>h`` (consecutive N-hour windows counted from an anchor, the key's or
tenant's creation time). A period is ``[start, end)`` in epoch seconds; spend
resets at ``end``."""

from __future__ import annotations

import re
from datetime import datetime, timezone

_HOURS = re.compile(r"^([1-9][0-9]{0,4})h$")


def check_period(period: str) -> str:
    """``period`` normalised, or ValueError saying what is accepted."""
    text = str(period).strip().lower()
    if text in ("daily", "monthly") or _HOURS.match(text):
        return text
    raise ValueError(f"budget_period must be 'daily', 'monthly' or '<N>h' (N = 1..99999 hours), got {period!r}")


def period_bounds(period: str, now: float, anchor: float = 0.0) -> tuple[float, float]:
    """``(start, end)`` of the period holding ``now``."""
    if period == "daily":
        start = (now // 86400) * 86400
        return start, start + 86400
    if period == "monthly":
        t = datetime.fromtimestamp(now, timezone.utc)
        first = datetime(t.year, t.month, 1, tzinfo=timezone.utc)
        following = datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=timezone.utc)
        return first.timestamp(), following.timestamp()
    m = _HOURS.match(period)
    assert m, period
    length = int(m.group(1)) * 3600.0
    start = anchor + ((now - anchor) // length) * length
    return start, start + length


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
