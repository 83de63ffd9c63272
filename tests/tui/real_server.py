"""A real tokenops server (gateway + admin API + store) on a loopback port, for the
dashboard's acceptance tests and the CPU benchmark."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ADMIN_KEY = "dashboard-test-admin-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(store_dir: Path, backends: Any = None, settings: Any = None, ready_timeout_s: float = 120.0) -> Iterator[str]:
    """Serve ``create_app(settings, backends)`` under uvicorn in a thread; yields the base URL.

    ``backends=None`` runs the bundled engine on the default demo model.
    """
    import uvicorn

    from tokenops.config import EngineSettings, GatewaySettings, Settings, StoreSettings
    from tokenops.gateway.app import create_app
    from tokenops.gateway.auth import hash_key
    from tokenops.store import Store, sink

    settings = settings or Settings(
        gateway=GatewaySettings(admin_key=ADMIN_KEY),
        store=StoreSettings(path=str(store_dir / "tokenops.duckdb")),
        engine=EngineSettings(kv_cache_tokens=1024, max_num_seqs=8, max_num_batched_tokens=256, torch_threads=1),
        slo=["ttft_p95=2s", "e2e_p50=5s"],
    )
    store = Store.open(store_dir / "tokenops.duckdb")
    writer = store.writer(flush_interval_s=0.05)
    previous = sink.attach(writer)
    app = create_app(settings, backends, store=store, admin_key_hash=hash_key(ADMIN_KEY))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            assert thread.is_alive(), "the server thread died"
            assert time.monotonic() < deadline, "the server did not become ready"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
        sink.detach()
        if previous is not None:
            sink.attach(previous)
        store.close()


def send_traffic(url: str, num_requests: int = 6, max_tokens: int = 6) -> list[dict[str, Any]]:
    """Real chat completions through the OpenAI endpoint, a few concurrently."""
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    results: list[dict[str, Any]] = []

    def one(i: int) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": f"count to {i} please"}], "max_tokens": max_tokens}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        r.raise_for_status()
        results.append(r.json())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(num_requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == num_requests
    return results


def admin_get(url: str, path: str) -> Any:
    r = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    r.raise_for_status()
    return r.json()
