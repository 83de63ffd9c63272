"""Per-layer expert-load heatmap with the max/mean imbalance of each layer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.color import Color
from rich.style import Style
from rich.text import Text
from textual.widget import Widget

_COLD = Color.from_rgb(24, 40, 90)
_HOT = Color.from_rgb(240, 70, 40)


def expert_matrix(load: Any) -> list[list[float]] | None:
    """Normalise an engine's ``expert_load`` to ``[layer][expert]`` token counts (None: not MoE).

    Accepts a list of per-layer lists, a ``{layer: [...]}`` mapping, or ``{"layers": [...]}``.
    """
    if not load:
        return None
    if isinstance(load, dict):
        if "layers" in load:
            return expert_matrix(load["layers"])
        rows = [load[k] for k in sorted(load, key=lambda k: int(k) if str(k).isdigit() else str(k))]
    else:
        rows = list(load)
    matrix = [[float(x) for x in row] for row in rows if row is not None]
    return matrix or None


def imbalance(row: Sequence[float]) -> float | None:
    """max/mean of one layer's expert loads; None when the layer saw no tokens."""
    if not row:
        return None
    mean = sum(row) / len(row)
    return max(row) / mean if mean > 0 else None


def _blend(fraction: float) -> Style:
    r1, g1, b1 = _COLD.triplet or (0, 0, 0)
    r2, g2, b2 = _HOT.triplet or (0, 0, 0)
    rgb = tuple(round(a + (b - a) * fraction) for a, b in zip((r1, g1, b1), (r2, g2, b2)))
    return Style(bgcolor=Color.from_rgb(*rgb))


class ExpertHeatmap(Widget):
    """One row per layer, one coloured cell per expert (hotter = more tokens than the layer max)."""

    DEFAULT_CSS = """
    ExpertHeatmap { height: auto; border: round $panel-lighten-2; padding: 0 1; }
    """

    def __init__(self, replica: str, matrix: list[list[float]], **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = f"{replica} · expert load"
        self.border_subtitle = "colour: tokens vs the layer's busiest expert · max/mean ≥ 2 in red"
        self.matrix = matrix

    def set_matrix(self, matrix: list[list[float]]) -> None:
        self.matrix = matrix
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.matrix) + 1

    def render(self) -> Text:
        num_experts = max((len(r) for r in self.matrix), default=0)
        room = max(1, self.content_size.width - 16)
        cell = 2 if num_experts * 2 <= room else 1
        shown = min(num_experts, room // cell)
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"layer  experts 0..{num_experts - 1}", style="dim")
        if shown < num_experts:
            text.append(f" (first {shown} shown)", style="dim")
        text.append("  max/mean", style="dim")
        for index, row in enumerate(self.matrix):
            top = max(row, default=0.0) or 1.0
            text.append(f"\nL{index:<4} ")
            for value in row[:shown]:
                text.append(" " * cell, style=_blend(value / top))
            ratio = imbalance(row)
            style = "bold red" if ratio is not None and ratio >= 2 else ""
            text.append(f"  {ratio:.2f}" if ratio is not None else "  –", style=style)
        return text
