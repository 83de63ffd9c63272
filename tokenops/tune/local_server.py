"""The tuner's way into a ``tokenops serve`` of this folder: its store channel
(:mod:`tokenops.store.channel`) reads and sets live tunables for the local user that
runs the server, so ``tokenops tune`` needs neither ``--url`` nor the admin key."""

from __future__ import annotations

from typing import Any

from tokenops.tune.errors import TuneError


class LocalAdmin:
    """``tunables()`` / ``patch()`` like :class:`tokenops.tune.target.AdminClient`, over the channel."""

    def __init__(self, remote: Any) -> None:
        self.remote = remote
        self.url = remote.server_info.get("url")

    @classmethod
    def find(cls, store_path: str | None = None) -> LocalAdmin | None:
        """The server holding this folder's store (``TOKENOPS_STORE`` or ``store/tokenops.duckdb``), or None."""
        from tokenops.store.remote import connect_server

        remote = connect_server(store_path, read_only=False)
        if remote is None or not remote.server_info.get("url"):
            return None
        return cls(remote)

    @property
    def info(self) -> dict[str, Any]:
        return self.remote.server_info

    def tunables(self) -> list[dict[str, Any]]:
        return self._call("tunables")

    def patch(self, values: dict[str, Any], actor: str = "tune") -> dict[str, Any]:
        if not values:
            return {}
        return self._call("set_tunables", values=values, actor=actor)

    def _call(self, op: str, **args: Any) -> Any:
        from tokenops.store import StoreError

        try:
            return self.remote.call(op, **args)
        except StoreError as e:
            raise TuneError(str(e).removeprefix("server store channel: ")) from None

    def close(self) -> None:
        self.remote.close()
