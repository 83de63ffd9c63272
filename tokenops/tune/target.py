"""A running server under tuning: reads and sets live tunables through the admin API
(``GET``/``PATCH /admin/tunables``) and measures one load level."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tokenops.bench.metrics import BenchSummary
from tokenops.bench.runner import BenchPlan, run_level
from tokenops.tunables import Tunable
from tokenops.tune.errors import TuneError

__all__ = ["AdminClient", "TuneError", "measure", "tunables_from_server"]


def _error_message(r: httpx.Response) -> str:
    try:
        return r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return r.text[:200]


class AdminClient:
    """The admin endpoints the tuner uses."""

    def __init__(self, url: str, admin_key: str | None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers)

    def _check(self, r: httpx.Response, what: str) -> dict[str, Any]:
        if r.status_code == 401:
            raise TuneError(f"{self.url} refused the admin key ({what}); pass --admin-key or set TOKENOPS_ADMIN_KEY")
        if r.status_code != 200:
            raise TuneError(f"{what} failed with HTTP {r.status_code}: {_error_message(r)}")
        return r.json()

    def _get_tunables(self) -> dict[str, Any]:
        try:
            r = self.client.get(f"{self.url}/admin/tunables")
        except httpx.HTTPError as e:
            raise TuneError(f"cannot reach {self.url}: {type(e).__name__}: {e}") from None
        return self._check(r, "GET /admin/tunables")

    def tunables(self) -> list[dict[str, Any]]:
        return self._get_tunables()["tunables"]

    @property
    def info(self) -> dict[str, Any] | None:
        """The server's deployment facts (as :attr:`tokenops.tune.local_server.LocalAdmin.info`);
        None from a server that does not report them."""
        facts = self._get_tunables().get("deployment")
        return facts if isinstance(facts, dict) else None

    def patch(self, values: dict[str, Any], actor: str = "tune") -> dict[str, Any]:
        if not values:
            return {}
        r = self.client.patch(f"{self.url}/admin/tunables", json={"values": values, "actor": actor})
        return self._check(r, "PATCH /admin/tunables").get("applied", {})

    def close(self) -> None:
        self.client.close()


def tunables_from_server(rows: list[dict[str, Any]]) -> tuple[list[Tunable], dict[str, Any]]:
    """Tunable declarations and current values as the server reports them."""
    fields = set(Tunable.__dataclass_fields__)
    tunables, current = [], {}
    for row in rows:
        data = {k: v for k, v in row.items() if k in fields}
        if data.get("choices") is not None:
            data["choices"] = tuple(data["choices"])
        tunables.append(Tunable(**data))
        current[row["name"]] = row.get("value", row.get("default"))
    return tunables, current


def measure(plan: BenchPlan, model: str, requests: list, rate: float) -> BenchSummary:
    """One open-loop measurement at ``rate`` requests/s."""
    return asyncio.run(run_level(plan, model, requests, rate, None)).summary
