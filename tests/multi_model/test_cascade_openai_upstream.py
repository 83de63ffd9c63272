"""A cascade over OpenAI-compatible upstreams that return logprobs, through a real
``tokenops serve``: the gateway asks the upstream for logprobs (the client did not), the
logprob validator scores the cheap tier from them, a low-confidence answer escalates, and
the client's answer carries no logprobs."""

from __future__ import annotations

import socket
import threading
import time

import openai
import pytest

from tokenops.testing_serve import ServeProcess

# upstream model id -> (answer, per-token probability it reports)
ANSWERS = {"unsure-7b": ("maybe 41", 0.2), "sure-70b": ("42", 0.95)}


class LogprobUpstream:
    """A tiny OpenAI-compatible server: chat answers with logprobs when asked; keeps every body."""

    def __init__(self) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        self.bodies: list[dict] = []

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"} for m in ANSWERS]})

        async def chat(request: Request) -> JSONResponse:
            import math

            body = await request.json()
            self.bodies.append(body)
            text, p = ANSWERS[body["model"]]
            tokens = text.split(" ")
            logprobs = {"content": [{"token": t, "logprob": math.log(p), "bytes": list(t.encode()), "top_logprobs": []}
                                    for t in tokens]} if body.get("logprobs") else None
            return JSONResponse({"id": "chatcmpl-up", "object": "chat.completion", "created": 0, "model": body["model"],
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "logprobs": logprobs, "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": len(tokens), "total_tokens": 5 + len(tokens)}})

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        app = Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LogprobUpstream":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "upstream did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="module")
def upstream():
    with LogprobUpstream() as up:
        yield up


def test_cascade_escalates_on_upstream_logprobs(upstream, tmp_path):
    url = f"http://127.0.0.1:{upstream.port}/v1"
    config = f"""
[[models]]
name = "cheap"
backend = "openai"
url = "{url}"
served_model = "unsure-7b"
cost_input_per_1m = 0.1
cost_output_per_1m = 0.4

[[models]]
name = "strong"
backend = "openai"
url = "{url}"
served_model = "sure-70b"
cost_input_per_1m = 1.0
cost_output_per_1m = 4.0

[plugins.cascade]
models = ["cheap", "strong"]
threshold = 0.5

[plugins.validators]
use = ["logprob"]
"""
    with ServeProcess(tmp_path, config=config, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        answer = client.chat.completions.create(model="cascade", messages=[{"role": "user", "content": "6*7?"}])
        assert answer.choices[0].message.content == "42"
        assert answer.choices[0].logprobs is None  # the gateway asked for them, not the client
        asked = [b for b in upstream.bodies if b["model"] in ANSWERS]
        assert [b["model"] for b in asked[-2:]] == ["unsure-7b", "sure-70b"]
        assert all(b.get("logprobs") is True for b in asked[-2:])
        import httpx

        rows = httpx.get(f"{srv.url}/admin/requests", headers=srv.admin_headers).json()["requests"]
        steps = rows[0]["decisions"]["cascade"]["steps"]
        assert [s["model"] for s in steps] == ["cheap", "strong"]
        assert steps[0]["score"] == pytest.approx(0.2, rel=1e-6) and rows[0]["escalated"]
