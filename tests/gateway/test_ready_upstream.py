"""`/ready` reflects an upstream that cannot be reached: listed and not serving while it is
down, serving again once it answers."""

from __future__ import annotations

import http.server
import json
import threading
import time

import httpx

from tokenops.testing_serve import ServeProcess, free_port


class _Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({"object": "list", "data": [{"id": "remote", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_ready_lists_an_unreachable_upstream_until_it_answers(tmp_path):
    port = free_port()
    config = ('[[models]]\nname = "chat"\n\n'  # the embedded (toy) model
              f'[[models]]\nname = "remote"\nbackend = "openai"\nurl = "http://127.0.0.1:{port}/v1"\n')
    with ServeProcess(tmp_path, config=config) as srv:
        r = httpx.get(f"{srv.url}/ready")
        body = r.json()
        assert r.status_code == 200 and body["degraded"] is True  # chat still serves
        assert body["replicas"]["remote#0"] is False and "cannot reach" in body["unreachable"]["remote#0"]
        upstream = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Models)
        threading.Thread(target=upstream.serve_forever, daemon=True).start()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                body = httpx.get(f"{srv.url}/ready").json()
                if body["replicas"]["remote#0"]:
                    break
                time.sleep(0.5)
            assert body["replicas"]["remote#0"] is True and "unreachable" not in body, body
        finally:
            upstream.shutdown()
