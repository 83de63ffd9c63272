"""One headline number in a bordered box."""

from __future__ import annotations

from textual.widgets import Static


class MetricTile(Static):
    """``label`` in the border, ``value_text`` (already formatted) as the body."""

    DEFAULT_CSS = """
    MetricTile {
        width: 1fr;
        height: 3;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        content-align: center middle;
        text-style: bold;
    }
    MetricTile.-bad { color: $error; }
    MetricTile.-good { color: $success; }
    """

    def __init__(self, label: str, **kwargs) -> None:
        super().__init__("–", **kwargs)
        self.border_title = label
        self.value_text = "–"

    def show(self, value_text: str, is_good: bool | None = None) -> None:
        """Display ``value_text``; ``is_good`` colours it (None: neutral)."""
        self.value_text = value_text
        self.update(value_text)
        self.set_class(is_good is True, "-good")
        self.set_class(is_good is False, "-bad")
