"""Capability profiles for the routers, as ``serve`` sees them.

Profiles come from two places: ``profiles/models/*.toml`` (what ``tokenops profile run``
writes; ``[plugins.router.profile] profiles_dir`` or ``TOKENOPS_PROFILES_DIR`` move it)
and the store's ``capability_profiles`` table (per model and dimension). For each
dimension the newer of the two wins. :class:`ProfileSource` loads them when the gateway
starts and polls both for changes, so a profile written while the server runs (a new
TOML file, or rows through the store channel) is routed on within a poll interval.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("tokenops.gateway")

DEFAULT_DIR = "profiles/models"
POLL_INTERVAL_S = 2.0


def _as_naive(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).replace(tzinfo=None)
        except ValueError:
            return None
    return None


def merge_profiles(from_files: dict[str, dict], store_rows: list[tuple]) -> dict[str, dict]:
    """File profiles overlaid with store rows ``(model, dimension, score, ci_low, ci_high, n, updated_at)``;
    a store row replaces a file's dimension when it is newer than the file's ``updated_at``."""
    out = {m: {**p, "dimensions": dict(p.get("dimensions", {}))} for m, p in from_files.items()}
    for model, dimension, score, ci_low, ci_high, n, updated_at in store_rows:
        if score is None:
            continue
        profile = out.setdefault(model, {"model": model, "source": "store", "dimensions": {}})
        file_time = _as_naive(profile.get("updated_at")) if profile.get("source") != "store" else None
        row_time = _as_naive(updated_at)
        if (
            dimension in profile["dimensions"]
            and file_time is not None
            and row_time is not None
            and row_time <= file_time
        ):
            continue
        profile["dimensions"][dimension] = {
            "score": float(score),
            "ci_low": float(ci_low if ci_low is not None else score),
            "ci_high": float(ci_high if ci_high is not None else score),
            "n": int(n or 0),
        }
    return out


class ProfileSource:
    """Loads profiles from a folder and a store, and keeps ``target.profiles`` current."""

    def __init__(self, directory: str | Path, store: Any = None, interval_s: float = POLL_INTERVAL_S) -> None:
        self.directory = Path(directory)
        self.store = store
        self.interval_s = interval_s
        self._signature: tuple | None = None
        self._task: asyncio.Task | None = None
        self.num_reloads = 0

    @classmethod
    def from_settings(cls, settings: Any, store: Any = None) -> ProfileSource:
        conf = (settings.plugin_settings("router") or {}).get("profile") or {}
        directory = os.environ.get("TOKENOPS_PROFILES_DIR") or conf.get("profiles_dir") or DEFAULT_DIR
        return cls(directory, store, float(conf.get("reload_interval_s", POLL_INTERVAL_S)))

    def _file_signature(self) -> tuple:
        if not self.directory.is_dir():
            return ()
        return tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in self.directory.glob("*.toml")))

    def _store_rows(self) -> list[tuple]:
        if self.store is None:
            return []
        try:
            return self.store.execute(
                "SELECT model, dimension, score, ci_low, ci_high, n, updated_at "
                "FROM capability_profiles ORDER BY model, dimension"
            ).fetchall()
        except Exception as e:  # an unreadable store leaves the file profiles in force
            log.warning("capability profiles: store not readable (%s)", e)
            return []

    def load(self) -> dict[str, dict]:
        """Read both sources now (blocking); remembers what it read for :meth:`changed`."""
        from tokenops.routing.profiles import load_profiles

        rows = self._store_rows()
        self._signature = (self._file_signature(), tuple(map(tuple, rows)))
        try:
            files = load_profiles(self.directory)
        except Exception as e:  # a half-written or broken TOML: keep serving, say which
            log.warning("capability profiles: %s not readable (%s)", self.directory, e)
            files = {}
        return merge_profiles(files, rows)

    def changed(self) -> bool:
        return (self._file_signature(), tuple(map(tuple, self._store_rows()))) != self._signature

    def start(self, target: Any) -> None:
        """Poll for changes in the background and assign ``target.profiles`` on each."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(target), name="tokenops-profiles")

    async def _watch(self, target: Any) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                if await asyncio.to_thread(self.changed):
                    target.profiles = await asyncio.to_thread(self.load)
                    self.num_reloads += 1
                    log.info("capability profiles reloaded: %s", ", ".join(sorted(target.profiles)) or "none")
            except Exception as e:
                log.warning("capability profiles: reload failed (%s)", e)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
