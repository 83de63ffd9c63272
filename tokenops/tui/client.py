"""Blocking client of the tokenops admin API. The dashboard calls it from thread workers."""

from __future__ import annotations

from typing import Any, Protocol

import httpx


class AdminError(Exception):
    """The server answered with an error; ``message`` is its OpenAI-style error message."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class ServerUnreachable(AdminError):
    """No server answered at the URL (refused, timed out, DNS)."""


class Client(Protocol):
    """What the app needs from :class:`tokenops.tui.client.AdminClient` (tests inject fakes)."""

    url: str

    def stats(self) -> dict[str, Any]: ...
    def tunables(self) -> list[dict[str, Any]]: ...
    def patch_tunables(self, values: dict[str, Any], actor: str = "dashboard") -> dict[str, Any]: ...
    def query(self, name: str, **params: Any) -> dict[str, Any]: ...
    def batches(self) -> dict[str, Any]: ...
    def gateways(self) -> dict[str, Any]: ...


class AdminClient:
    """Thin wrapper over ``httpx.Client`` for the ``/admin`` endpoints.

    Every method blocks; call them from ``@work(thread=True)`` workers, never from
    the event loop.
    """

    def __init__(self, url: str, admin_key: str | None = None, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise ServerUnreachable(f"{self.url}: {type(e).__name__}: {e}") from None
        if response.status_code == 401:  # say where the dashboard reads a key, not how to send one
            raise AdminError(
                f"{_error_message(response)} The dashboard reads it from --admin-key-file, "
                "TOKENOPS_ADMIN_KEY, or the key file of this folder's server (store/admin_key).",
                401,
            )
        if response.status_code >= 400:
            raise AdminError(_error_message(response), response.status_code)
        try:
            return response.json()
        except ValueError:
            raise AdminError(f"{path}: the server answered with non-JSON", response.status_code) from None

    def stats(self) -> dict[str, Any]:
        """``GET /admin/stats``: the live snapshot (rates, latency, engines, models, history)."""
        return self._request("GET", "/admin/stats")

    def tunables(self) -> list[dict[str, Any]]:
        """``GET /admin/tunables``: every registered tunable with its current ``value``."""
        return self._request("GET", "/admin/tunables")["tunables"]

    def patch_tunables(self, values: dict[str, Any], actor: str = "dashboard") -> dict[str, Any]:
        """``PATCH /admin/tunables``; raises :class:`AdminError` with the server's reason on 400."""
        return self._request("PATCH", "/admin/tunables", json={"values": values, "actor": actor})

    def query(self, name: str, **params: Any) -> dict[str, Any]:
        """``GET /admin/query/{name}``: ``{"name", "columns", "rows"}`` of a named store query."""
        return self._request("GET", f"/admin/query/{name}", params=params)

    def batches(self) -> dict[str, Any]:
        """``GET /admin/batches``: every tenant's batches (progress, rates, ETA) and interactive latency."""
        return self._request("GET", "/admin/batches")

    def gateways(self) -> dict[str, Any]:
        """``GET /admin/gateways``: the service's gateway replicas with their health."""
        return self._request("GET", "/admin/gateways")


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"
