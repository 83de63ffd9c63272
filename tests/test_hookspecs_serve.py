"""Against a real ``tokenops serve``: a slow ``tokenops_route`` marked ``@may_block`` runs in a
worker thread and ``/health`` keeps answering; the same router unmarked stalls it (which is
what the mark is for)."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tokenops.testing_serve import ServeProcess

PLUGIN = '''
import time

from tokenops import hookimpl, may_block


@hookimpl
def tokenops_register_backends(register):
    from tokenops.testing_gateway import FakeBackend

    register("fake", lambda model, settings: FakeBackend(model.name, f"{model.name}#0", reply="routed fine"))


@hookimpl
@may_block(when=lambda request: "marked" in request.prompt_text())
def tokenops_route(request):
    if "slow" in request.prompt_text():
        time.sleep(1.0)  # a router doing a second of blocking work (embedding a long text, a model call)
    return None  # the built-in router then routes by name
'''

CONFIG = """
[[models]]
name = "m"
backend = "fake"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slow_route")
    (workdir / "slow_route.py").write_text(PLUGIN)
    with ServeProcess(workdir, config=CONFIG, env={"TOKENOPS_PLUGINS": str(workdir / "slow_route.py")},
                      store=False) as srv:
        yield srv


def _worst_health_latency_during_chat(server: ServeProcess, prompt: str) -> tuple[float, str]:
    """Back-to-back ``GET /health`` while one chat request (openai SDK) is routed; the slowest one."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    answer: dict[str, str] = {}

    def chat() -> None:
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}], max_tokens=8)
        answer["text"] = r.choices[0].message.content

    thread = threading.Thread(target=chat)
    worst = 0.0
    with httpx.Client(base_url=server.url, timeout=10) as probe:
        probe.get("/health")  # connection up before the chat starts
        thread.start()
        while thread.is_alive():
            t0 = time.perf_counter()
            assert probe.get("/health").status_code == 200
            worst = max(worst, time.perf_counter() - t0)
    thread.join()
    return worst, answer.get("text", "")


def test_a_slow_router_marked_may_block_does_not_stall_health(server):
    worst, text = _worst_health_latency_during_chat(server, "slow and marked")
    assert text.startswith("routed fine")
    # a stalled loop answers after the router's full second; 0.54 s was seen on a loaded 2-core box
    assert worst < 0.8, f"/health took {worst:.2f} s while a @may_block router slept 1 s"


def test_the_same_router_unmarked_stalls_health(server):
    worst, text = _worst_health_latency_during_chat(server, "slow")
    assert text.startswith("routed fine")
    assert worst > 0.6, f"/health took only {worst:.2f} s: the unmarked router should have blocked the loop"
