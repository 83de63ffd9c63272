"""The top line of every screen: which server, and whether it answers."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tokenops.tui.connection import ConnectionState


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class ConnectionBanner(Static):
    """Green when connected, red with the reason and the next retry when not."""

    DEFAULT_CSS = """
    ConnectionBanner { height: 1; padding: 0 1; background: $panel; }
    ConnectionBanner.-connected { background: $success-darken-3; }
    ConnectionBanner.-down { background: $error-darken-2; color: $text; text-style: bold; }
    """

    def __init__(self, screen_title: str, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.screen_title = screen_title

    def show(self, state: ConnectionState) -> None:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"tokenops · {self.screen_title}  ", style="bold")
        if state.status == "connected":
            text.append(f"● {state.url}")
            if state.uptime_s is not None:
                text.append(f"  up {_duration(state.uptime_s)}")
        elif state.status == "connecting":
            text.append(f"… connecting to {state.url}")
        else:
            word = "server unreachable" if state.status == "unreachable" else "server error"
            text.append(f"✖ {word}")
            if state.retry_in_s is not None:
                text.append(f" · retry #{state.num_failures} in {state.retry_in_s:g}s")
            text.append(f" · {state.error}")
        if state.is_paused:
            text.append("  [paused]", style="bold yellow")
        self.set_class(state.status == "connected", "-connected")
        self.set_class(state.status in ("unreachable", "error"), "-down")
        self.update(text)
