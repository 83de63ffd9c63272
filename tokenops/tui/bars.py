"""Inline bars for table cells (KV usage, traffic share)."""

from __future__ import annotations

from rich.text import Text

from tokenops.tui.format import fmt_pct


def usage_bar(fraction: float | None, width: int = 10, warn: float = 0.8, danger: float = 0.95) -> Text:
    """``█████░░░░░ 52.0%``; yellow above ``warn``, red above ``danger``."""
    if fraction is None:
        return Text("–")
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    color = "red" if fraction >= danger else "yellow" if fraction >= warn else "green"
    text = Text(no_wrap=True)
    text.append("█" * filled, style=color)
    text.append("░" * (width - filled), style="dim")
    text.append(f" {fmt_pct(fraction)}")
    return text
