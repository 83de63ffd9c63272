"""One headline number under its label."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class MetricTile(Static):
    """``label`` on the first line, ``value_text`` (already formatted) bold below it."""

    DEFAULT_CSS = """
    MetricTile {
        width: 1fr;
        height: 2;
        margin: 0 1 0 0;
        padding: 0 1;
        background: $boost;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    MetricTile.-bad { color: $error; }
    MetricTile.-good { color: $success; }
    """

    def __init__(self, label: str, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.label = label
        self.value_text = "–"
        self._paint()

    def show(self, value_text: str, is_good: bool | None = None) -> None:
        """Display ``value_text``; ``is_good`` colours it (None: neutral)."""
        self.value_text = value_text
        self.set_class(is_good is True, "-good")
        self.set_class(is_good is False, "-bad")
        self._paint()

    def _paint(self) -> None:
        self.update(Text.assemble((self.label, "dim"), "\n", (self.value_text, "bold")))
