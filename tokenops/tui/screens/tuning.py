"""Tuning: every tunable with value, range, live flag and help; edit live; change history with revert."""

from __future__ import annotations

import json
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.widgets import DataTable

from tokenops.tui.client import AdminError
from tokenops.tui.format import fmt_cell
from tokenops.tui.messages import LoadFailed, TuningLoaded, TuningResult
from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.tables import ensure_columns, sync_rows
from tokenops.tui.widgets.tunable_editor import TunableEditor, describe_range

#: Seconds between automatic reloads while the screen is shown.
RELOAD_INTERVAL_S = 10.0

TUNABLE_COLUMNS = (
    ("name", "tunable"),
    ("value", "value"),
    ("range", "range/choices"),
    ("live", "live"),
    ("help", "help"),
)


def parse_stored(value: Any) -> Any:
    """Store columns may hold JSON text (``16``, ``"fcfs"``); plain strings pass through."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class TuningScreen(DashboardScreen):
    SCREEN_TITLE = "Tuning"
    BINDINGS = [
        Binding("r", "revert", "Revert"),
        Binding("u", "reload", "Reload", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.tunables: dict[str, dict[str, Any]] = {}
        self.changes: dict[str, Any] | None = None

    def compose_body(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="tunables", cursor_type="row", zebra_stripes=True)
        table.border_title = "tunables (enter: edit)"
        yield table
        yield TunableEditor(id="editor")
        changes: DataTable[Any] = DataTable(id="changes", cursor_type="row")
        changes.border_title = "config changes (r: revert · u: reload)"
        yield changes

    def on_mount(self) -> None:
        ensure_columns(self.query_one("#tunables", DataTable), TUNABLE_COLUMNS)
        # Others (the tuner, another operator) change tunables too.
        self.set_interval(RELOAD_INTERVAL_S, self._reload_if_shown)

    def _reload_if_shown(self) -> None:
        if self.is_current:
            self.load()

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.action_reload()

    def action_reload(self) -> None:
        self.load()

    @work(thread=True, exclusive=True, group="tuning-load")
    def load(self) -> None:
        client = self.app.client
        try:
            tunables = client.tunables()
        except AdminError as e:
            self.post_message(LoadFailed(e.message))
            return
        try:
            changes = client.query("config_changes")
        except AdminError:
            changes = None
        self.post_message(TuningLoaded(tunables, changes))

    @on(TuningLoaded)
    def _loaded(self, message: TuningLoaded) -> None:
        self.tunables = {t["name"]: t for t in message.tunables}
        self.changes = message.changes
        rows = {
            t["name"]: [
                t["name"],
                fmt_cell(t.get("value")),
                describe_range(t),
                "yes" if t.get("live") else "restart",
                t.get("help", ""),
            ]
            for t in message.tunables
        }
        changes = self.query_one("#changes", DataTable)
        with self.app.batch_update():
            sync_rows(self.query_one("#tunables", DataTable), rows)
            if message.changes is not None:
                columns = message.changes["columns"]
                ensure_columns(changes, [(c, c) for c in columns])
                sync_rows(
                    changes,
                    {key: [fmt_cell(v) for v in row] for key, row in self._change_rows().items()},
                    keep_order=True,
                )

    def _change_rows(self) -> dict[str, list[Any]]:
        """``config_changes`` rows by a stable key: the store's ``id`` when it has one."""
        assert self.changes is not None
        columns, rows = self.changes["columns"], self.changes["rows"]
        if "id" in columns:
            index = columns.index("id")
            return {f"id{row[index]}": row for row in rows}
        return {f"c{i}": row for i, row in enumerate(rows)}

    @on(LoadFailed)
    def _load_failed(self, message: LoadFailed) -> None:
        self.query_one(TunableEditor).show_rejected(f"could not load tunables: {message.error}", by_server=True)

    @on(DataTable.RowSelected, "#tunables")
    def _edit(self, event: DataTable.RowSelected) -> None:
        tunable = self.tunables.get(event.row_key.value or "")
        if tunable is not None:
            self.query_one(TunableEditor).edit(tunable)

    def action_cancel_edit(self) -> None:
        self.query_one("#tunables", DataTable).focus()

    @on(TunableEditor.Submitted)
    def _submit(self, message: TunableEditor.Submitted) -> None:
        self.apply({message.name: message.value})

    @work(thread=True, exclusive=True, group="tuning-apply")
    def apply(self, values: dict[str, Any]) -> None:
        try:
            result = self.app.client.patch_tunables(values, actor="dashboard")
        except AdminError as e:
            self.post_message(TuningResult(values, None, e.message))
            return
        self.post_message(TuningResult(values, result.get("applied", values), None))

    @on(TuningResult)
    def _result(self, message: TuningResult) -> None:
        editor = self.query_one(TunableEditor)
        if message.error is not None:
            editor.show_rejected(message.error, by_server=True)
            return
        editor.show_applied(message.applied or {})
        self.load()

    def action_revert(self) -> None:
        """PATCH the highlighted change's old value back."""
        table = self.query_one("#changes", DataTable)
        if self.changes is None or not self.changes["rows"] or table.cursor_row is None:
            self.notify("no change selected", severity="warning")
            return
        key = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value
        assert key is not None  # every row is added with its change id as key
        row = dict(zip(self.changes["columns"], self._change_rows()[key]))
        name = row.get("name")
        editor = self.query_one(TunableEditor)
        if name not in self.tunables:
            editor.show_rejected(f"cannot revert: unknown tunable {name!r}", by_server=False)
            return
        old = parse_stored(row.get("old_value"))
        if old is None:
            editor.show_rejected(f"cannot revert {name}: no old value recorded", by_server=False)
            return
        editor.edit(self.tunables[name])
        editor.submit(json.dumps(old) if isinstance(old, bool) else str(old))
