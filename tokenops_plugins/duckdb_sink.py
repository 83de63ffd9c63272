"""The built-in telemetry sink: events go to the DuckDB store's batched writer
attached with :func:`tokenops.store.sink.attach` (the gateway does this)."""

from tokenops import hookimpl
from tokenops.store import sink

TOKENOPS_LAYER = "telemetry"


@hookimpl
def tokenops_record(event):
    sink.record(event)
