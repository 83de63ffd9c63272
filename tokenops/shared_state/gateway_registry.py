"""Which gateway replicas serve the service, and how each is doing: the list the dashboard shows
(``GET /admin/gateways`` on any replica).

With ``[shared] redis_url`` every replica writes its own line into one Redis hash every
``interval_s`` seconds (a heartbeat: url, pid, phase, ready, requests in flight, when it started
and was last seen) and reads everyone's. A replica not seen for three intervals is ``down`` (killed,
or cut off); one that stopped cleanly says ``stopped``; lines older than ``forget_s`` are dropped.
Without Redis the list is this replica alone.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class GatewayRegistry:
    """This replica's heartbeat and everyone's list. ``status`` returns this replica's live fields
    (``phase``, ``ready``, ``in_flight``)."""

    def __init__(
        self,
        url: str,
        status: Callable[[], dict[str, Any]],
        client: Any = None,
        *,
        prefix: str = "tokenops",
        interval_s: float = 2.0,
        forget_s: float = 3600.0,
    ) -> None:
        self.id = f"{socket.gethostname()}:{url.rsplit(':', 1)[-1]}"
        self.url = url
        self.status = status
        self.client = client
        self.key = f"{prefix}:gateways"
        self.interval_s = interval_s
        self.forget_s = forget_s
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self, phase: str | None = None) -> dict[str, Any]:
        """This replica as it appears in the list."""
        live = self.status()
        if phase is not None:
            live["phase"] = phase
        return {
            "id": self.id,
            "url": self.url,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "seen_at": time.time(),
            **live,
        }

    def start(self) -> None:
        if self.client is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gateway-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and say so (the line stays, as ``stopped``, until forgotten)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._beat("stopped")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._beat()
            self._stop.wait(self.interval_s)

    def _beat(self, phase: str | None = None) -> None:
        try:
            self.client.hset(self.key, self.id, json.dumps(self.line(phase)))
        except Exception as e:  # Redis away: the others see this replica as down meanwhile
            log.warning("gateway registry: heartbeat not written (%s)", e)

    def gateways(self) -> list[dict[str, Any]]:
        """Every replica (this one first), each with ``health``: ``up``, ``down`` or ``stopped``,
        and ``seen_s_ago``; sorted by id after this one."""
        now = time.time()
        mine = {**self.line(), "health": "up", "seen_s_ago": 0.0, "is_self": True}
        if self.client is None:
            return [mine]
        try:
            raw = self.client.hgetall(self.key)
        except Exception as e:
            return [{**mine, "registry_error": str(e)}]
        others = []
        for gateway_id, value in raw.items():
            gid = gateway_id.decode() if isinstance(gateway_id, bytes) else gateway_id
            if gid == self.id:
                continue
            line = json.loads(value)
            ago = now - float(line.get("seen_at", 0))
            if ago > self.forget_s:
                self.client.hdel(self.key, gid)
                continue
            stopped = line.get("phase") == "stopped"
            health = "stopped" if stopped else ("up" if ago <= 3 * self.interval_s else "down")
            others.append({**line, "health": health, "seen_s_ago": round(ago, 1), "is_self": False})
        return [mine, *sorted(others, key=lambda g: g["id"])]
