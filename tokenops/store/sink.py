"""Where the built-in DuckDB telemetry sink sends events.

The ``duckdb_sink`` plugin (``tokenops_plugins.duckdb_sink``) implements
``tokenops_record(event)`` by calling :func:`record`. A process that owns a
store connects it for the plugin's lifetime::

    writer = store.writer()          # tokenops.store.Store
    sink.attach(writer)              # at gateway start-up
    ...                              # hook().tokenops_record(event=...) now lands in DuckDB
    sink.detach()                    # at shutdown, before store.close()

Only one writer is attached at a time (``attach`` replaces and returns the
previous one). While none is attached, events are counted in
:data:`num_unattached` and dropped. Events whose ``kind`` is not a telemetry
table of the writer are left to other sinks.

This module imports nothing heavy, so loading the plugin stays cheap.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenops.store.writer import TelemetryWriter

_lock = threading.Lock()
_writer: TelemetryWriter | None = None
num_unattached = 0  # events seen while no writer was attached


def attach(writer: TelemetryWriter) -> TelemetryWriter | None:
    """Send telemetry events to ``writer`` from now on; returns the previous writer."""
    global _writer
    with _lock:
        previous, _writer = _writer, writer
    return previous


def detach() -> TelemetryWriter | None:
    """Stop sending events; returns the writer that was attached (not closed)."""
    global _writer
    with _lock:
        previous, _writer = _writer, None
    return previous


def current() -> TelemetryWriter | None:
    """The attached writer, or None."""
    return _writer


def record(event: Any) -> bool:
    """Queue ``event.data`` (a row dict or a list of them) in table ``event.kind``.

    Returns True when queued; False when no writer is attached, the kind is not
    a telemetry table, or the writer dropped the rows (its queue is full)."""
    global num_unattached
    writer = _writer
    if writer is None:
        num_unattached += 1
        return False
    if not writer.accepts(event.kind):
        return False
    ts = getattr(event, "ts", None)
    if isinstance(event.data, dict):
        return writer.write(event.kind, event.data, ts=ts)
    return writer.write_many(event.kind, list(event.data), ts=ts)
