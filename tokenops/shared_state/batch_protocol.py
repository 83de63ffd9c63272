"""What the Files and Batch APIs and the batch runner ask of file and batch state, whichever
store keeps it.

Two implementations: :class:`tokenops.store.batch_store.BatchStore` (the embedded default: the
gateway's own DuckDB store, file bytes in ``<store folder>/files``; one process) and
:class:`tokenops.shared_state.postgres_batches.PostgresBatchStore` (``[shared] postgres_url``:
the rows and the file bytes in PostgreSQL, so every gateway replica of a service sees the same
files and batches; each keeps a local copy of the bytes it reads). Both are per tenant (another
tenant's file or batch reads as missing). A batch runs on one replica at a time: the runner
:meth:`~BatchState.claim`\\ s it first and renews the claim while it runs; a cancel written on any
replica is seen by the one running it (``is_shared``: it reads the batch's state each second), and
each finished line is saved as it finishes (:meth:`~BatchState.save_lines`) so the replica that
takes over a batch whose runner died runs only the lines not finished.

Every call blocks (DuckDB work, or a round trip to PostgreSQL): the gateway runs them in a
worker thread.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class BatchState(Protocol):
    """Files (metadata and bytes) and batches, per tenant."""

    #: True when other gateway processes share this state (the runner then watches for their cancels).
    is_shared: bool

    def path(self, file_id: str) -> Path:
        """The local file holding ``file_id``'s bytes (fetched first when another replica wrote them);
        where a new file is written before :meth:`add_file`."""
        ...

    def add_file(
        self, file_id: str, tenant: str, purpose: str, filename: str | None, num_lines: int,
        batch_id: str | None = None, expires_after_s: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Record the file written at :meth:`path` (its bytes go with it where the state is shared);
        it expires ``expires_after_s`` after its ``created_at`` (None: never)."""
        ...

    def file(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        """The tenant's file; None when it has none or the file has expired (reads of files and lists
        leave expired files out, to the second, before they are swept)."""
        ...

    def files(
        self, tenant: str, purpose: str | None = None, after: str | None = None, limit: int = 10000,
        newest_first: bool = True,
    ) -> list[dict[str, Any]]: ...  # fmt: skip

    def num_files(self, tenant: str) -> int: ...

    def delete_file(self, tenant: str, file_id: str) -> bool: ...

    def expired_files(self, now: datetime) -> list[tuple[str, str]]:
        """``(tenant, file id)`` of every file expired at ``now`` (naive UTC), for the sweep to delete."""
        ...

    def purge_tenant(self, tenant: str) -> dict[str, int]:
        """Delete every file and batch of ``tenant``, bytes too; ``{"files": n, "batches": m}``."""
        ...

    def add_batch(self, row: dict[str, Any]) -> dict[str, Any]: ...

    def batch(self, tenant: str | None, batch_id: str) -> dict[str, Any] | None:
        """The batch of ``tenant`` (any tenant's when None: the runner's view)."""
        ...

    def batches(self, tenant: str, after: str | None = None, limit: int = 20) -> list[dict[str, Any]]: ...

    def active_batches(self) -> list[dict[str, Any]]:
        """Every batch with work left, oldest first."""
        ...

    def recent_batches(self, limit: int = 50) -> list[dict[str, Any]]: ...

    def update_batch(self, batch_id: str, **fields: Any) -> None: ...

    def save_lines(self, batch_id: str, lines: list[tuple[str, bool, bytes]]) -> None:
        """Record finished lines (``custom_id``, is an error, the output line) as they finish, so a
        replica that takes the batch over (its runner died) skips them; the first line of a
        ``custom_id`` stays. A no-op where one process keeps the state (its files are the record)."""
        ...

    def saved_lines(self, batch_id: str) -> list[tuple[str, bool, bytes]]:
        """What :meth:`save_lines` recorded for ``batch_id``, in any order."""
        ...

    def forget_lines(self, batch_id: str) -> None:
        """Drop a finished batch's saved lines (its output and error files hold them)."""
        ...

    def claim(self, batch_id: str, owner: str, ttl_s: float) -> bool:
        """Take (or renew) the right to run ``batch_id`` for ``ttl_s`` seconds; False while another
        owner's claim holds."""
        ...
