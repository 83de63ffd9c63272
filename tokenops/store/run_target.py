"""Where ``bench`` and ``tune`` save a run: the store of the server they measured.

A run against this folder's server goes to this folder's store (through the server's
store socket while it holds the file). A run against another tokenops server goes to
*that* server's store through its admin API (``POST /admin/store/rows``, admin key
needed), so ``tokenops report`` next to that server lists it. Without the key, or
against a server that is not tokenops, the run stays in this folder's store and the
output says so — never silently somewhere the operator will not look.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tokenops.store import wire
from tokenops.store.errors import StoreError

#: The tables a client may append to over the admin API: runs measured against the server.
RUN_TABLES = frozenset({"bench_runs", "bench_results", "tune_trials"})


def _root(url: str | None) -> str:
    return (url or "").rstrip("/").removesuffix("/v1").replace("localhost", "127.0.0.1")


class AdminStore:
    """``add(*rows)`` into a remote server's store over ``POST /admin/store/rows``."""

    def __init__(self, url: str, admin_key: str, timeout_s: float = 30.0) -> None:
        self.url = _root(url)
        self.client = httpx.Client(
            timeout=timeout_s, headers={"Authorization": f"Bearer {admin_key}", "content-type": "application/json"}
        )

    def add(self, *objects: Any) -> None:
        body = wire.encode({"objects": [{"table": o.__tablename__, "values": o.model_dump()} for o in objects]})
        try:
            r = self.client.post(f"{self.url}/admin/store/rows", content=body)
        except httpx.HTTPError as e:
            raise StoreError(f"cannot reach {self.url}: {type(e).__name__}") from None
        if r.status_code != 200:
            try:
                why = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                why = r.text[:200]
            raise StoreError(f"{self.url} did not take the run (HTTP {r.status_code}: {why})")

    def close(self) -> None:
        self.client.close()


@dataclass(slots=True)
class RunTarget:
    """A store to write to: a remote server's (``remote``) or a local path."""

    path: str
    remote: AdminStore | None = None
    #: why the run is not in the measured server's store (shown with where it went)
    note: str | None = None

    def describe(self) -> str:
        if self.remote is not None:
            return f"the store of the server at {self.remote.url}"
        return self.path + (f" ({self.note})" if self.note else "")


def run_target(url: str | None, admin_key: str | None, store: str | None) -> RunTarget:
    """Where a run measured against ``url`` goes (``store``: an explicit --store wins)."""
    from tokenops.store.remote import local_server_url
    from tokenops.store.store import default_path

    path = store or default_path()
    if store or not url or _root(url) == _root(local_server_url(None)):
        return RunTarget(path)
    if not admin_key:
        return RunTarget(
            path,
            note=f"not the store of {_root(url)}: give --admin-key-file (or TOKENOPS_ADMIN_KEY) to save runs there",
        )
    return RunTarget(path, AdminStore(url, admin_key))


def save_rows(target: RunTarget, rows: list[Any]) -> str:
    """Write ``rows`` to ``target``; returns where they went, in words. A remote server that does
    not take them (not tokenops, no store, refused key) leaves them in the local store, said so."""
    from tokenops.store import open_store

    if target.remote is not None:
        try:
            target.remote.add(*rows)
            return target.describe()
        except StoreError as e:
            target.note = f"{e}; kept here instead"
            target.remote = None
        finally:
            if target.remote is not None:
                target.remote.close()
    store = open_store(target.path)  # through the server when one holds the file
    try:
        store.add(*rows)
    finally:
        store.close()
    return target.describe()
