"""Watch a running server from outside: ``/health`` every 20 ms and its resident memory.

``HealthProbe(url, pid)`` runs this file as its own process (the test's threads and GIL must not
delay the probe) and reads its lines, ``<monotonic start> <latency s> <rss bytes>``; ``window(t0,
t1)`` gives the probes that started in a time window (CLOCK_MONOTONIC is one clock for every
process of the machine).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass(frozen=True)
class Window:
    latencies: list[float]
    rss: list[int]

    @property
    def p50_ms(self) -> float:
        return 1000 * statistics.median(self.latencies) if self.latencies else 0.0

    @property
    def p99_ms(self) -> float:
        s = sorted(self.latencies)
        return 1000 * s[int(0.99 * (len(s) - 1))] if s else 0.0

    @property
    def max_ms(self) -> float:
        return 1000 * max(self.latencies) if self.latencies else 0.0


class HealthProbe:
    def __init__(self, url: str, pid: int) -> None:
        self.pid = pid
        self._samples: list[tuple[float, float, int]] = []
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([sys.executable, __file__, url, str(pid)], stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            t, lat, rss = line.split()
            with self._lock:
                self._samples.append((float(t), float(lat), int(rss)))

    def window(self, t0: float, t1: float, settle_s: float = 0.5) -> Window:
        """Probes whose wait overlapped ``[t0, t1]`` (the one in flight when the window opened
        included), waiting up to ``settle_s`` plus the longest outstanding probe for their answers."""
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline or self._last_start() < t1:
            if time.monotonic() > deadline + 60:
                break
            time.sleep(0.02)
        with self._lock:
            picked = [s for s in self._samples if s[0] <= t1 and s[0] + s[1] >= t0]
        return Window([s[1] for s in picked], [s[2] for s in picked])

    def _last_start(self) -> float:
        with self._lock:
            return self._samples[-1][0] if self._samples else 0.0

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)


def _main(url: str, pid: int) -> None:
    import httpx

    with httpx.Client(base_url=url, timeout=60) as client:
        while True:
            t0 = time.monotonic()
            try:
                client.get("/health")
            except httpx.HTTPError:
                pass
            lat = time.monotonic() - t0
            print(f"{t0:.6f} {lat:.6f} {rss_bytes(pid)}", flush=True)
            time.sleep(0.02)


if __name__ == "__main__":
    _main(sys.argv[1], int(sys.argv[2]))
