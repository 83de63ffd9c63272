"""Issue 17 defect 4 through a real ``tokenops serve``: a dead replica costs no client
errors while a healthy one is left, recovery is probed in the background, and
breaker state shows in ``/admin/stats`` and ``/metrics``."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.serve_configs import config as serve_config, openai_model, section
from tokenops.testing_serve import ServeProcess, free_port

MSG = [{"role": "user", "content": "hi"}]


class Upstream:
    """An OpenAI-compatible upstream (the gateway app on a FakeBackend) under uvicorn in a thread."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.num_requests = 0
        self.server = None
        self.thread = None

    def start(self) -> "Upstream":
        import uvicorn

        from tokenops.gateway.app import create_app
        from tokenops.gateway.auth import hash_key
        from tokenops.testing_gateway import FakeBackend

        upstream = self

        class Counting(FakeBackend):
            async def stream(self, request):
                upstream.num_requests += 1
                async for d in super().stream(request):
                    yield d

        app = create_app(None, {"m": [Counting("m", f"up{self.port}", reply="from upstream")]},
                         admin_key_hash=hash_key("k"))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def _states(gw: ServeProcess) -> dict:
    return httpx.get(f"{gw.url}/admin/stats", headers=gw.admin_headers).json()["breakers"]


def _wait_for(predicate, timeout_s: float) -> float:
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout_s, "timed out"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_a_dead_replica_costs_no_client_errors_and_recovers_by_background_probes(tmp_path):
    a, b = Upstream().start(), Upstream().start()
    config = serve_config(
        openai_model("m", urls=[a.url, b.url], max_retries=0),
        section("plugins.circuit_breaker", consecutive_failures=3, cooldown_s=1.0, health_probe_interval_s=0.3),
    )
    try:
        with ServeProcess(tmp_path, config=config, store=False) as gw:
            client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
            for _ in range(4):
                assert client.chat.completions.create(model="m", messages=MSG).choices[0].message.content
            assert a.num_requests and b.num_requests  # both replicas serve
            a.stop()
            for i in range(20):  # requests right after the death: retried on b, never an error
                if i % 2:
                    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                        model="m", messages=MSG, stream=True) if c.choices)
                else:
                    text = client.chat.completions.create(model="m", messages=MSG).choices[0].message.content
                assert text.strip() == "from upstream"
            _wait_for(lambda: _states(gw).get("m#0") == "open", 3.0)
            metrics = httpx.get(f"{gw.url}/metrics").text
            assert 'tokenops:replica_breaker_state{replica="m#0",state="open"} 1' in metrics
            assert 'tokenops:replica_breaker_state{replica="m#1",state="closed"} 1' in metrics
            recent = httpx.get(f"{gw.url}/admin/requests?limit=20", headers=gw.admin_headers).json()["requests"]
            assert all(r["status"] == "ok" for r in recent), recent

            a2 = Upstream(a.port).start()  # the replica comes back on the same address
            try:
                # closed again by the prober's trial calls; no client request was spent on them
                _wait_for(lambda: _states(gw).get("m#0") == "closed", 10.0)
                assert a2.num_requests == 0
                for _ in range(6):
                    client.chat.completions.create(model="m", messages=MSG)
                assert a2.num_requests > 0  # and it takes traffic again
            finally:
                a2.stop()
    finally:
        b.stop()


@pytest.mark.slow
def test_kill_9_between_requests_costs_no_errors_and_mid_stream_errors_stop_at_once():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from replica_kill import run

    between = run(stream=False, clients=3, seconds=5.0, kill_at=2.0, breaker=True)
    assert between["errors"] == 0 and between["ok_after_kill"] > 0, between
    mid = run(stream=True, clients=3, seconds=5.0, kill_at=2.0, breaker=True)
    assert mid["error_seconds_after_kill"] < 2.0 and mid["ok_after_kill"] > 0, mid
