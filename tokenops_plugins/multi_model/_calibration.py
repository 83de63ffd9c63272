"""Threshold calibration on recorded router scores, honest about ties.

The threshold router sends a request to the strong model when its score is at or
above the threshold, so the share a threshold really sends is the share of recorded
scores ``>= threshold``. With tied scores no threshold may give the share asked for;
:func:`calibrate_share` picks the one that comes closest and reports what it sends.
"""

from __future__ import annotations


def strong_share(scores: list[float], threshold: float) -> float:
    """Share of ``scores`` the threshold router sends to the strong model."""
    return sum(s >= threshold for s in scores) / len(scores) if scores else 0.0


def calibrate_share(scores: list[float], wanted: float) -> tuple[float, float]:
    """(threshold, share it really sends) closest to ``wanted`` among the distinct
    thresholds the scores allow (each distinct score, or above the highest: none)."""
    if not scores:
        raise ValueError("no recorded threshold-router scores to calibrate on; route some traffic through it first")
    if not 0 < wanted < 1:
        raise ValueError("--strong-share must be between 0 and 1")
    distinct = sorted(set(scores))
    candidates = distinct + [distinct[-1] + max(1e-6, abs(distinct[-1]) * 1e-6)]
    best = min(candidates, key=lambda t: (abs(strong_share(scores, t) - wanted), t))
    return best, strong_share(scores, best)
