"""Pieces of the Prometheus text exposition format (0.0.4) shared by every part that writes
``/metrics`` lines: the gateway's own series and the managed keys' spend and budget series."""

from __future__ import annotations

PREFIX = "tokenops:"


def label(value: str) -> str:
    """``value`` escaped for a label value in double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    """A sample value: integers without a decimal point, other floats as ``repr`` writes them."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
