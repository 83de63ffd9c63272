"""SLO grammar: ``[metric_]pNN=VALUE[ms|s]``; bare ``pNN`` means TTFT.

Examples: ``p95=200ms``, ``ttft_p99=0.3s``, ``tpot_p95=50ms``, ``e2e_p90=2s``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

METRICS = ("ttft", "tpot", "itl", "e2e")

_SLO_RE = re.compile(
    r"^\s*(?:(?P<metric>[a-z0-9]+)_)?p(?P<pct>\d+(?:\.\d+)?)\s*(?:=|<=|<)\s*"
    r"(?P<value>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>ms|s)?\s*$",
    re.IGNORECASE,
)


class SLOError(ValueError):
    """Malformed SLO text; the message shows the accepted grammar."""


@dataclass(slots=True, frozen=True)
class SLO:
    metric: str  # ttft | tpot | itl | e2e
    percentile: float  # 0 < p < 100
    threshold_s: float

    def __post_init__(self) -> None:
        assert self.metric in METRICS
        assert 0 < self.percentile < 100
        assert self.threshold_s > 0

    @property
    def label(self) -> str:
        pct = f"{self.percentile:g}"
        return f"{self.metric}_p{pct}={self.threshold_s * 1000:g}ms"

    def is_met(self, value_s: float) -> bool:
        return value_s <= self.threshold_s


_HELP = "expected [ttft|tpot|itl|e2e_]pNN=VALUE[ms|s], e.g. p95=200ms or tpot_p99=0.05s"


def parse_slo(text: str) -> SLO:
    """Parse one SLO clause; raise :class:`SLOError` with a one-line reason."""
    m = _SLO_RE.match(text or "")
    if not m:
        raise SLOError(f"bad SLO {text!r}: {_HELP}")
    metric = (m.group("metric") or "ttft").lower()
    if metric not in METRICS:
        raise SLOError(f"bad SLO {text!r}: unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    pct = float(m.group("pct"))
    if not 0 < pct < 100:
        raise SLOError(f"bad SLO {text!r}: percentile must be between 0 and 100 (exclusive)")
    value = float(m.group("value"))
    unit = (m.group("unit") or "ms").lower()
    seconds = value / 1000 if unit == "ms" else value
    if seconds <= 0:
        raise SLOError(f"bad SLO {text!r}: the threshold must be positive")
    return SLO(metric, pct, seconds)


def parse_slos(texts: list[str] | tuple[str, ...] | str) -> list[SLO]:
    """Parse several clauses (a list, or one string separated by commas)."""
    if isinstance(texts, str):
        texts = [t for t in texts.split(",") if t.strip()]
    slos = [parse_slo(t) for t in texts]
    seen = set()
    for s in slos:
        key = (s.metric, s.percentile)
        if key in seen:
            raise SLOError(f"SLO {s.metric}_p{s.percentile:g} is given twice")
        seen.add(key)
    return slos
