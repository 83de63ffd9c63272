"""Issue 37 through a real ``tokenops serve`` (two replicas of one model, a cascade, a fallback onto an
``openai`` upstream, the semantic cache) driven by the openai SDK: one OpenTelemetry trace per request
in a real collector, Arize Phoenix, started by the test and read back through its REST API; a client's
``traceparent`` as the root's parent and sent on upstream; the ``x-tokenops-*`` decision headers
(streams: in the final chunk too). Phoenix does not return span kinds or the resource:
``test_decisions_visible.py`` checks those against the small OTLP receiver."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import openai
import pytest

from tokenops.testing_serve import ServeProcess
from tests.gateway.openai_upstream import Upstream
from tests.gateway.phoenix_collector import Phoenix, phoenix_python

pytest.importorskip("opentelemetry.sdk")

LADDER = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models"
#: The client's trace: W3C traceparent version-traceid-parentid-flags.
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
OTHER_TRACE = "0af7651916cd43dd8448eb211c80319c"


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens: a killed upstream


def config(collector: str, upstream: str) -> str:
    return f"""
[[models]]
name = "small"
backend = "local"
path = "{LADDER / 'ladder-small'}"
replicas = 2
cost_input_per_1m = 0.1
cost_output_per_1m = 0.4

[[models]]
name = "large"
backend = "local"
path = "{LADDER / 'ladder-large'}"
cost_input_per_1m = 0.6
cost_output_per_1m = 2.4

[[models]]
name = "up"
backend = "openai"
url = "{upstream}/v1"
cost_input_per_1m = 1.0
cost_output_per_1m = 2.0

[[models]]
name = "dead"
backend = "openai"
url = "{dead_url()}"
max_retries = 0
timeout_s = 5

[plugins.fallback.chains]
dead = ["up"]

[plugins.cascade]
models = ["small", "large"]
threshold = 0.999

[plugins.validators]
use = ["logprob"]

[plugins.semantic_cache]
enabled = true
embedder = "lexical"

[telemetry]
otlp_endpoint = "{collector}"
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if phoenix_python() is None:  # `make install` makes it: CI must not pass by skipping
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "Arize Phoenix is not installed: `make install` (or `make phoenix`) makes .venv-phoenix")
    # Phoenix starts (tens of seconds: its database migrations) while serve loads its models
    with Phoenix(tmp_path_factory.mktemp("phoenix")) as collector, Upstream() as upstream:
        with ServeProcess(tmp_path_factory.mktemp("tracing"), config=config(collector.url, upstream.url),
                          env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as srv:
            collector.wait_ready()
            yield srv, collector, upstream


def roots(spans: list[dict]) -> dict[str, dict]:
    """request id (as the response's id ends) -> its root span (it carries the request id; attempts carry
    theirs with an attempt number)."""
    return {s["attributes"]["tokenops.request_id"].split("-", 1)[-1]: s for s in spans
            if "tokenops.request_id" in s["attributes"] and "tokenops.attempt" not in s["attributes"]}


def test_one_trace_per_request_with_decision_headers(stack):
    srv, collector, upstream = stack
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Name a primary colour."}]
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"

    first = client.chat.completions.with_raw_response.create(model="small", messages=ask, max_tokens=8,
                                                             extra_headers={"traceparent": traceparent})
    again = client.chat.completions.with_raw_response.create(model="small", messages=ask, max_tokens=8)
    fell = client.chat.completions.with_raw_response.create(model="dead", messages=[{"role": "user", "content": "hi"}],
                                                            max_tokens=8, extra_headers={"traceparent": f"00-{OTHER_TRACE}-b7ad6b7169203331-01"})
    climbed = client.chat.completions.with_raw_response.create(
        model="cascade", messages=[{"role": "user", "content": "Explain tides."}], max_tokens=8)
    streamed = client.chat.completions.with_raw_response.create(
        model="small", messages=[{"role": "user", "content": "Count to three."}], max_tokens=8, stream=True)
    chunks = list(streamed.parse())

    # decision headers
    h = first.headers
    assert h["x-tokenops-model"] == "small" and h["x-tokenops-replica"].startswith("small")
    assert h["x-tokenops-cache"] == "miss" and float(h["x-tokenops-cost-usd"]) > 0
    assert again.headers["x-tokenops-cache"] == "hit; match=exact"
    assert again.headers["x-tokenops-route"].startswith("cache")
    assert fell.headers["x-tokenops-model"] == "up" and "fallback:unavailable" in fell.headers["x-tokenops-route"]
    assert climbed.headers["x-tokenops-model"] == "large"
    assert climbed.headers["x-tokenops-route"].startswith("cascade; ") and "escalated" in climbed.headers["x-tokenops-route"]
    assert streamed.headers["x-tokenops-model"] == "small" and "x-tokenops-cost-usd" not in streamed.headers
    final = chunks[-1].model_extra["tokenops"]  # a stream's cost is known at its end
    assert final["model"] == "small" and final["cost_usd"] > 0 and final["replica"] == streamed.headers["x-tokenops-replica"]

    ids = [r.parse().id.split("-", 1)[-1] for r in (first, again, fell, climbed)] + [chunks[0].id.split("-", 1)[-1]]
    spans = collector.wait_for(lambda spans: set(ids) <= set(roots(spans)))
    by_request = roots(spans)
    traces = {by_request[i]["trace_id"] for i in ids}
    assert len(traces) == len(ids), "one trace per request"
    children: dict[str, list[dict]] = {}
    for s in spans:
        children.setdefault(s["trace_id"], []).append(s)

    def names(request_id: str) -> list[str]:
        return [s["name"] for s in children[by_request[request_id]["trace_id"]]]

    def attempts(request_id: str) -> list[dict]:
        return sorted((s for s in children[by_request[request_id]["trace_id"]] if "tokenops.attempt" in s["attributes"]),
                      key=lambda s: s["attributes"]["tokenops.attempt"])

    # the client's traceparent is the root's parent
    root = by_request[ids[0]]
    assert root["trace_id"] == CLIENT_TRACE and root["parent_span_id"] == CLIENT_SPAN
    a = root["attributes"]
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "small"
    assert a["gen_ai.response.model"] == "small" and a["gen_ai.usage.input_tokens"] > 0
    assert a["gen_ai.usage.output_tokens"] > 0 and a["tokenops.cost_usd"] > 0 and a["tokenops.cache"] == "miss"
    assert a["tokenops.tenant"]
    for step in ("tokenops.admission", "tokenops.cache_lookup", "tokenops.route", "engine.queue", "engine.prefill",
                 "engine.decode"):
        assert step in names(ids[0]), step
    decode = next(s for s in children[CLIENT_TRACE] if s["name"] == "engine.decode")
    assert decode["attributes"]["gen_ai.usage.output_tokens"] > 0
    # cache hit: no backend attempt
    assert by_request[ids[1]]["attributes"]["tokenops.cache"] == "hit" and not attempts(ids[1])
    # fallback: a failed attempt on `dead`, then one on `up`, whose traceparent reached the upstream
    tried = attempts(ids[2])
    assert [s["attributes"]["gen_ai.request.model"] for s in tried] == ["dead", "up"]
    assert tried[0]["status"] == 2 and tried[1]["attributes"]["tokenops.attempt.reason"] == "fallback"
    assert by_request[ids[2]]["trace_id"] == OTHER_TRACE
    sent = [hd.get("traceparent") for hd in upstream.headers]
    assert f"00-{OTHER_TRACE}-{tried[1]['span_id']}-01" in sent
    # cascade: small, then large as a cascade step
    steps = attempts(ids[3])
    assert [s["attributes"]["gen_ai.request.model"] for s in steps] == ["small", "large"]
    assert steps[1]["attributes"]["tokenops.attempt.reason"] == "cascade_step"
    assert by_request[ids[3]]["attributes"]["tokenops.escalated"] is True
    # the stream: its attempt ends with the stream, with the engine's spans
    s_root = by_request[ids[4]]["attributes"]
    assert s_root["tokenops.stream"] is True and s_root["gen_ai.usage.output_tokens"] > 0
    assert "engine.decode" in names(ids[4])
