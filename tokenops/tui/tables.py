"""Keyed DataTable updates: rows are added, changed in place or removed, never rebuilt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from textual.widgets import DataTable


def ensure_columns(table: DataTable, columns: Sequence[tuple[str, str]]) -> None:
    """Give ``table`` exactly these ``(key, label)`` columns, clearing it if they changed."""
    wanted = [key for key, _ in columns]
    if [c.value for c in table.columns] == wanted:
        return
    table.clear(columns=True)
    for key, label in columns:
        table.add_column(label, key=key)


def sync_rows(table: DataTable, rows: Mapping[str, Sequence[Any]], keep_order: bool = False) -> None:
    """Make ``table`` show ``rows`` (row key → cells in column order), updating by key.

    New keys are appended; with ``keep_order`` the rows are re-added when the key order
    changed (a newest-first history gaining a row). Call inside ``app.batch_update()``
    so the whole table repaints once.
    """
    column_keys = list(table.columns)
    if keep_order and [k.value for k in table.rows] != list(rows):
        table.clear()
    for row_key in [k for k in table.rows if k.value not in rows]:
        table.remove_row(row_key)
    for key, cells in rows.items():
        assert len(cells) == len(column_keys), (key, len(cells), len(column_keys))
        if key in table.rows:
            current = table.get_row(key)
            for column, old, new in zip(column_keys, current, cells):
                if old != new:
                    table.update_cell(key, column, new, update_width=True)
        else:
            table.add_row(*cells, key=key)
