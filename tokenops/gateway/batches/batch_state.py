"""The app's Batch API state: the :class:`~tokenops.store.batch_store.BatchStore` (in the
server's store, file bytes in ``<store folder>/files/``; in memory and a temporary folder
with ``--no-store``) and the runner, plus the wire shapes of a file and a batch."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from tokenops.gateway.errors import APIError
from tokenops.store.batch_store import BatchStore, unix

#: OpenAI accepts only "24h"; "<N>h", "<N>m" and "<N>s" are tokenops' extension (docs/batches.md)
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([hms])$")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}
MAX_WINDOW_S = 7 * 24 * 3600.0


def window_seconds(value: Any) -> float:
    """Seconds of a ``completion_window``, or the 400 naming it."""
    match = _WINDOW.match(value) if isinstance(value, str) else None
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)] if match else 0.0
    if not match or seconds > MAX_WINDOW_S:
        raise APIError(
            400,
            f'completion_window must be "24h" (or, as tokenops\' extension, <N>h, <N>m or <N>s up to 168h); '
            f"got {value!r}",
            code="invalid_value",
            param="completion_window",
        )
    return seconds


def batch_store(app: Any) -> BatchStore:
    """The app's files and batches (created on first use): in PostgreSQL, shared by every gateway
    replica, when ``[shared] postgres_url`` is set (this process's copies of file bytes beside its
    store, or in a temporary folder); else in the gateway's store."""
    found = getattr(app.state, "batch_store", None)
    if found is None:
        gw = app.state.gateway
        store = gw.store
        path = getattr(store, "path", None)
        if store is None or path is None or path == ":memory:":
            folder = Path(tempfile.mkdtemp(prefix="tokenops-files-"))
        else:
            folder = Path(path).expanduser().parent / "files"
        url = gw.settings.shared.sqlalchemy_url
        if url is not None:
            from tokenops.shared_state.postgres_batches import PostgresBatchStore

            found = app.state.batch_store = PostgresBatchStore(url, folder)
            return found
        if store is None:
            from tokenops.store import Store

            store = app.state.batch_memory_store = Store.open(":memory:")
        found = app.state.batch_store = BatchStore(store, folder)
    return found


def batch_runner(app: Any) -> Any:
    """The app's :class:`~tokenops.gateway.batches.batch_runner.BatchRunner` (created on first use)."""
    runner = getattr(app.state, "batch_runner", None)
    if runner is None:
        from tokenops.gateway.batches.batch_runner import BatchRunner

        gw = app.state.gateway
        runner = app.state.batch_runner = BatchRunner(gw, batch_store(app), gw.settings.batches)
        gw.pipeline.batch_discount = gw.settings.batches.discount
        gw.prometheus.sections.append(runner.prometheus_lines)
    return runner


def purge_tenant(app: Any, tenant: str) -> dict[str, int]:
    """``DELETE /admin/tenants/{name}`` (on a worker thread): the tenant's batches stop, then its
    files and batches go, rows and bytes."""
    runner = getattr(app.state, "batch_runner", None)
    if runner is not None:
        runner.drop_tenant(tenant)
    return batch_store(app).purge_tenant(tenant)


def file_object(row: dict[str, Any]) -> dict[str, Any]:
    """A ``files`` row as OpenAI's File object."""
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["num_bytes"],
        "created_at": unix(row["created_at"]),
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "expires_at": unix(row.get("expires_at")),
        "status_details": None,
    }


_TIMES = (
    "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
    "failed_at", "expired_at", "cancelling_at", "cancelled_at",
)  # fmt: skip


def batch_object(row: dict[str, Any], live: dict[str, int] | None = None) -> dict[str, Any]:
    """A ``batches`` row as OpenAI's Batch object (``live``: the runner's counts, newer than the row's)."""
    counts = live or {"completed": row["num_completed"] or 0, "failed": row["num_failed"] or 0}
    return {
        "id": row["id"],
        "object": "batch",
        "endpoint": row["endpoint"],
        "errors": row["errors_json"],
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"],
        "status": row["status"],
        "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"],
        **{name: unix(row[name]) for name in _TIMES},
        "request_counts": {"total": row["num_total"] or 0, **counts},
        "metadata": row["metadata_json"],
    }
