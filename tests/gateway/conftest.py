"""Shared helpers for gateway tests."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

ADMIN = {"Authorization": "Bearer test-admin-key"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    """A uvicorn server for an ASGI app on a free loopback port, in a thread."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ThreadServer":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            assert self.thread.is_alive(), "uvicorn thread died"
            time.sleep(0.02)
        while httpx.get(self.url + "/ready").status_code != 200:  # backends load in the background
            assert time.monotonic() < deadline, "backends did not become ready"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture
def thread_server():
    return ThreadServer
