"""A small braille line chart of one or more series sharing a y axis from zero."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.text import Text
from textual.widget import Widget

# Braille dot bits by (column, row) inside one 2x4 cell.
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))


class LineChart(Widget):
    """Series are drawn right-aligned, one sample per braille column (two per cell).

    The first line is a legend with each series' latest value and the y-axis top;
    earlier series win a cell that two series share.
    """

    DEFAULT_CSS = """
    LineChart {
        height: 7;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        padding: 0 1;
    }
    """

    def __init__(self, title: str, fmt: Callable[[float | None], str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = title
        self._fmt = fmt
        self._series: list[tuple[str, list[float | None], str]] = []

    def set_series(self, series: Sequence[tuple[str, Sequence[float | None], str]]) -> None:
        """Replace the data: ``(label, values oldest→newest, colour)`` per series."""
        self._series = [(label, list(values), color) for label, values, color in series]
        self.refresh()

    def legend(self) -> Text:
        """Latest value of each series, then the y-axis top."""
        text = Text(no_wrap=True, overflow="ellipsis")
        for label, values, color in self._series:
            latest = next((v for v in reversed(values) if v is not None), None)
            text.append(f"{label} ", style=f"bold {color}")
            text.append(f"{self._fmt(latest)}  ")
        text.append(f"max {self._fmt(self._top())}", style="dim")
        return text

    def _top(self) -> float | None:
        values = [v for _, vs, _ in self._series for v in vs if v is not None]
        return max(values) if values else None

    def render(self) -> Text:
        width, height = self.content_size.width, self.content_size.height - 1
        out = self.legend()
        out.truncate(max(width, 1), overflow="ellipsis")
        if width <= 0 or height <= 0:
            return out
        num_x, num_y = width * 2, height * 4
        top = self._top() or 1.0
        cells = [[0] * width for _ in range(height)]
        colors: list[list[str | None]] = [[None] * width for _ in range(height)]
        for _, values, color in reversed(self._series):
            points = values[-num_x:]
            offset = num_x - len(points)
            previous: int | None = None
            for i, value in enumerate(points):
                if value is None:
                    previous = None
                    continue
                y = min(num_y - 1, max(0, round(value / top * (num_y - 1))))
                low, high = (y, y) if previous is None else (min(y, previous), max(y, previous))
                # A vertical run joins consecutive samples so steep changes stay visible.
                for dot_y in range(low, high + 1):
                    self._plot(cells, colors, offset + i, num_y - 1 - dot_y, color)
                previous = y
        for row, color_row in zip(cells, colors):
            out.append("\n")
            # One span per run of equal colour keeps the segment count (and render cost) low.
            run: list[str] = []
            run_color: str | None = None
            for bits, cell_color in zip(row, color_row):
                if cell_color != run_color and run:
                    out.append("".join(run), style=run_color or "")
                    run = []
                run_color = cell_color
                run.append(chr(0x2800 + bits) if bits else " ")
            out.append("".join(run), style=run_color or "")
        return out

    @staticmethod
    def _plot(cells: list[list[int]], colors: list[list[str | None]], x: int, y: int, color: str) -> None:
        cell_x, cell_y = divmod(x, 2), divmod(y, 4)
        cells[cell_y[0]][cell_x[0]] |= _DOTS[cell_x[1]][cell_y[1]]
        colors[cell_y[0]][cell_x[0]] = color
