"""Deleting captured distillation pairs (``distill_pairs``): per tenant, by age, beyond a row cap.

The same function runs in the process that holds the store (the server: admin API and its
store channel op ``distill_delete``) and in a CLI that opened the file itself; a CLI that
reaches a server's store through :class:`~tokenops.store.remote.RemoteStore` (which allows
reads only) calls the channel op, see :func:`delete`."""

from __future__ import annotations

from typing import Any

CHANNEL_OP = "distill_delete"


def _count(store: Any) -> int:
    return int(store.execute("SELECT count(*) FROM distill_pairs").fetchone()[0])


def delete_local(
    store: Any, tenant: str | None = None, older_than_days: float | None = None, max_rows_per_tenant: int | None = None
) -> int:
    """Delete on a store this process holds; returns the number of rows deleted."""
    from tokenops.store import sink

    writer = sink.current()
    if writer is not None:  # queued captures land first, so a purge leaves none behind
        writer.flush()
    before = _count(store)
    if tenant is not None:
        store.execute("DELETE FROM distill_pairs WHERE tenant = ?", [tenant])
    if older_than_days is not None:
        store.execute(
            "DELETE FROM distill_pairs WHERE ts < now()::TIMESTAMP - to_seconds(?)", [float(older_than_days) * 86400]
        )
    if max_rows_per_tenant is not None:
        store.execute(
            "DELETE FROM distill_pairs WHERE id IN (SELECT id FROM (SELECT id, row_number() OVER "
            "(PARTITION BY tenant ORDER BY ts DESC) AS k FROM distill_pairs) WHERE k > ?)",
            [int(max_rows_per_tenant)],
        )
    return before - _count(store)


def delete(store: Any, **criteria: Any) -> int:
    """:func:`delete_local`, through the server's store channel when ``store`` is remote."""
    if getattr(store, "is_remote", False):
        return int(store.call(CHANNEL_OP, **criteria))
    return delete_local(store, **criteria)


def channel_op(store: Any):
    """The store channel operation a server registers: ``{"op": "distill_delete", ...criteria}``."""
    keys = ("tenant", "older_than_days", "max_rows_per_tenant")
    return lambda msg: delete_local(store, **{k: msg.get(k) for k in keys})
