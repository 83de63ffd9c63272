"""How numbers are written on screen. Tests use the same functions to compare with /admin/stats."""

from __future__ import annotations

from typing import Any


def fmt_float(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def fmt_int(value: int | float | None) -> str:
    return "–" if value is None else f"{int(value):,}"


def fmt_seconds(value: float | None) -> str:
    """Latency: milliseconds below one second, else seconds."""
    if value is None:
        return "–"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:,.2f} s"


def fmt_pct(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value * 100:.{digits}f}%"


def fmt_usd(value: float | None) -> str:
    if value is None:
        return "–"
    return f"${value:,.4f}" if abs(value) < 1 else f"${value:,.2f}"


def fmt_cell(value: Any) -> str:
    """A store query cell: floats rounded, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def ratio(part: float | None, whole: float | None) -> float | None:
    return None if not whole or part is None else part / whole
