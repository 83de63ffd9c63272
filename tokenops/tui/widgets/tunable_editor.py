"""Edit one tunable: an input validated by the registry's own rules before it is sent."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Static

from tokenops.tunables import Tunable, TunableError

_TUNABLE_FIELDS = {f.name for f in fields(Tunable)}


def tunable_from_dict(data: dict[str, Any]) -> Tunable:
    """Rebuild the registry's :class:`Tunable` from the admin API's dict (extra keys dropped)."""
    return Tunable(**{k: v for k, v in data.items() if k in _TUNABLE_FIELDS})


def describe_range(data: dict[str, Any]) -> str:
    """``1..256``, ``fcfs|priority`` or ``any``."""
    if data.get("choices"):
        return "|".join(str(c) for c in data["choices"])
    low, high = data.get("minimum"), data.get("maximum")
    if low is None and high is None:
        return "true|false" if data.get("type") == "bool" else "any"
    return f"{'' if low is None else _num(low)}..{'' if high is None else _num(high)}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


class TunableEditor(Vertical):
    """Shows the selected tunable; Enter validates client-side, then posts :class:`Submitted`."""

    DEFAULT_CSS = """
    TunableEditor { height: auto; border: round $accent; padding: 0 1; }
    TunableEditor #editor-input { margin: 0; }
    TunableEditor #editor-status { height: 1; }
    TunableEditor.-rejected { border: round $error; }
    TunableEditor.-rejected #editor-status { color: $error; text-style: bold; }
    TunableEditor.-applied #editor-status { color: $success; }
    """

    BINDINGS = [Binding("escape", "screen.cancel_edit", "Back to the table")]

    @dataclass
    class Submitted(Message):
        """A value that passed client-side validation, ready for PATCH."""

        name: str
        value: Any

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.tunable: dict[str, Any] | None = None
        self.border_title = "edit"
        self.status_text = ""

    def compose(self) -> ComposeResult:
        yield Static("select a tunable and press enter", id="editor-title")
        yield Input(placeholder="new value", id="editor-input", disabled=True, compact=True)
        yield Static("", id="editor-status")

    def on_mount(self) -> None:
        self.query_one(Input).cursor_blink = False

    def edit(self, tunable: dict[str, Any]) -> None:
        """Load ``tunable`` (admin API dict with ``value``) into the input and focus it."""
        self.tunable = tunable
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(tunable["name"], style="bold")
        title.append(f"  {tunable['type']} {describe_range(tunable)}  ")
        title.append(
            "live" if tunable.get("live") else "needs restart", style="green" if tunable.get("live") else "yellow"
        )
        title.append(f"  {tunable.get('help', '')}", style="dim")
        self.query_one("#editor-title", Static).update(title)
        field = self.query_one(Input)
        field.disabled = False
        field.value = str(tunable.get("value"))
        field.focus()
        self._status("enter applies · escape cancels", None)

    @on(Input.Submitted, "#editor-input")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit(event.value)

    def submit(self, raw: str) -> None:
        """Validate ``raw`` with the tunable's rules; post :class:`Submitted` or show the rejection."""
        if self.tunable is None:
            return
        raw = raw.strip()
        self.query_one(Input).value = raw
        try:
            value = tunable_from_dict(self.tunable).validate(raw)
        except TunableError as e:
            self.show_rejected(str(e), by_server=False)
            return
        self._status(f"applying {self.tunable['name']} = {value!r} …", None)
        self.post_message(self.Submitted(self.tunable["name"], value))

    def show_rejected(self, message: str, by_server: bool) -> None:
        who = "server" if by_server else "validation"
        self._status(f"✖ rejected by {who}: {message}", "rejected")

    def show_applied(self, applied: dict[str, Any]) -> None:
        pairs = ", ".join(f"{k} = {v!r}" for k, v in applied.items())
        self._status(f"✓ applied live: {pairs}", "applied")

    def _status(self, text: str, state: str | None) -> None:
        self.status_text = text
        self.query_one("#editor-status", Static).update(Text(text, no_wrap=True, overflow="ellipsis"))
        self.set_class(state == "rejected", "-rejected")
        self.set_class(state == "applied", "-applied")
