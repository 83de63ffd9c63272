"""Issue 37 in process: decision headers switched off, honest ensemble usage and model, a dead
collector costing nothing but spans, and the tracing switch read from settings and OTEL_* variables."""

from __future__ import annotations

import json
import socket

import pytest
from tokenops.config import Settings
from tokenops.gateway.observability import tracing
from tokenops.testing_gateway import FakeBackend, gateway_client

MSG = [{"role": "user", "content": "What is 6*7?"}]


def sse_chunks(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def test_decision_headers_on_by_default_off_by_option():
    async with gateway_client({"m": [FakeBackend("m", reply="hello there")]}) as c:
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
        assert r.headers["x-tokenops-model"] == "m" and r.headers["x-tokenops-cache"] == "bypass"
        r = await c.post("/v1/completions", json={"model": "m", "prompt": "hi", "stream": True})
        last = sse_chunks(r.text)[-1]  # no usage chunk asked for: the last finish chunk carries them
        assert last["choices"][0]["finish_reason"] and last["tokenops"]["model"] == "m"
        # Messages and Responses streams: their last events with usage carry them
        r = await c.post("/v1/messages", json={"model": "m", "max_tokens": 8, "messages": MSG, "stream": True})
        [delta] = [e for e in sse_chunks(r.text) if e["type"] == "message_delta"]
        assert delta["tokenops"]["model"] == "m" and "cost_usd" in delta["tokenops"]
        assert sse_chunks(r.text)[-1] == {"type": "message_stop"}
        r = await c.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True})
        last = sse_chunks(r.text)[-1]
        assert last["type"] == "response.completed" and last["tokenops"]["model"] == "m"
        assert "tokenops" not in last["response"]
    settings = Settings()
    settings.gateway.decision_headers = False
    async with gateway_client({"m": [FakeBackend("m", reply="hello there")]}, settings) as c:
        for stream in (False, True):
            r = await c.post(
                "/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": MSG,
                    "stream": stream,
                    **({"stream_options": {"include_usage": True}} if stream else {}),
                },
            )
            assert r.status_code == 200
            assert not [h for h in r.headers if h.startswith("x-tokenops-")]
            assert "tokenops" not in r.text
        for path, body in (
            ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": MSG}),
            ("/v1/responses", {"model": "m", "input": "hi"}),
        ):
            for stream in (False, True):
                r = await c.post(path, json={**body, "stream": stream})
                assert r.status_code == 200 and not [h for h in r.headers if h.startswith("x-tokenops-")]
                assert "tokenops" not in r.text, path


async def test_ensemble_usage_is_every_billed_call_and_model_the_one_that_answered():
    small, big = FakeBackend("small", reply="42"), FakeBackend("big", reply="Combined 42")
    s = Settings()  # the gateway's own ensemble plugin reads it
    s.plugins["ensemble"] = {"members": ["small", "big"], "aggregator": "big", "samples": 3}
    async with gateway_client({"small": [small], "big": [big]}, s) as c:
        r = await c.post("/v1/chat/completions", json={"model": "ensemble:vote", "messages": MSG})
        body, rec = r.json(), c.gateway.recent[-1]
        assert len(small.requests) == 3 and body["model"] == "small"
        assert body["usage"]["prompt_tokens"] == rec.tokens_in and body["usage"]["completion_tokens"] == rec.tokens_out
        members = rec.decisions["ensemble"]["member_costs"]
        assert len(members) == 3 and rec.tokens_out == sum(m["completion_tokens"] for m in members) > 0
        r = await c.post("/v1/chat/completions", json={"model": "ensemble:moa", "messages": MSG})
        body, rec = r.json(), c.gateway.recent[-1]
        assert body["model"] == "big" and r.headers["x-tokenops-model"] == "big"  # the aggregator wrote the text
        assert rec.decisions["ensemble"]["answered_by"] == "big" and rec.decisions["ensemble"]["members"] == [
            "small",
            "big",
        ]
        assert body["usage"]["prompt_tokens"] == rec.tokens_in and body["usage"]["completion_tokens"] == rec.tokens_out
        assert len(big.requests) == 2  # its proposal and the aggregation, both in usage


def test_tracing_switch_reads_settings_and_standard_variables():
    assert tracing.endpoint_from(None, {}) is None
    assert tracing.endpoint_from("http://c:4318", {}) == "http://c:4318/v1/traces"
    assert tracing.endpoint_from(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    assert tracing.endpoint_from(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/x"}) == "http://c/x"
    assert tracing.endpoint_from("http://c:4318", {"OTEL_SDK_DISABLED": "true"}) is None


async def test_a_dead_collector_costs_only_spans():
    pytest.importorskip("opentelemetry.sdk")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    settings = Settings()
    settings.telemetry.otlp_endpoint = dead
    async with gateway_client({"m": [FakeBackend("m", reply="still served")]}, settings) as c:
        assert c.gateway.tracer is not None  # this gateway's own span builder
        with c.gateway.scope():
            assert tracing.is_on()
        for _ in range(20):
            r = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
            assert r.status_code == 200 and "still served" in r.text
    assert c.gateway.tracer is None and not tracing.is_on()  # stopped with its gateway


async def test_spans_have_kinds_and_the_service_resource():
    """What Arize Phoenix does not give back (test_tracing_serve.py reads the rest from it): the root is
    a server span, an attempt a client span, the steps internal, under the ``tokenops`` service."""
    pytest.importorskip("opentelemetry.sdk")
    from tests.gateway.otlp_receiver import Receiver

    settings = Settings()
    with Receiver() as receiver:
        settings.telemetry.otlp_endpoint = receiver.url
        async with gateway_client({"m": [FakeBackend("m", reply="traced")]}, settings) as c:
            r = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
            assert r.status_code == 200
        # the gateway's stop exported what was queued
        spans = receiver.wait_for(lambda spans: len({s["kind"] for s in spans}) == 3)
    [root] = [s for s in spans if s["parent_span_id"] is None]
    [attempt] = [s for s in spans if "tokenops.attempt" in s["attributes"]]
    assert (root["kind"], attempt["kind"]) == (2, 3)  # SERVER, CLIENT
    assert {s["kind"] for s in spans if s not in (root, attempt)} == {1}  # INTERNAL
    assert {s["resource"]["service.name"] for s in spans} == {"tokenops"}


def test_one_definition_of_an_error_in_stats_metrics_and_store_rows():
    from tokenops.gateway.observability.metrics_window import MetricsWindow
    from tokenops.gateway.observability.prometheus import PrometheusMetrics
    from tokenops.gateway.observability.records import RequestRecord

    window, prom = MetricsWindow(window_s=60), PrometheusMetrics()
    statuses = [200, 200, 404, 429, 499, 499, 500, 502]
    for status in statuses:
        rec = RequestRecord(
            id="r",
            kind="chat",
            tenant="t",
            model_requested="m",
            arrival=0.0,
            start=1.0,
            model_served="m",
            status=status,
        )
        rec.end = 2.0
        window.add(rec, now=1000.0)
        prom.observe(rec)
    requests = window.snapshot(now=1000.0)["requests"]
    assert (requests["errors"], requests["rejected"], requests["disconnected"]) == (2, 2, 2)
    assert requests["error_rate"] == 2 / len(statuses)  # the same denominator as the counts beside it
    text = prom.render({}, ["m"])
    assert 'request_failure_total{model_name="m"} 2' in text and 'request_disconnected_total{model_name="m"} 2' in text
    row = RequestRecord(id="r", kind="chat", tenant="t", model_requested="m", arrival=0.0, start=1.0, status=499).row()
    assert row["status"] == "disconnected"  # `report` counts status = 'error' only


async def test_decision_headers_on_embeddings():
    from tests.gateway.openai_upstream import Upstream
    from tokenops.backends.openai_http import OpenAIBackend
    from tokenops.config import ModelConfig

    with Upstream() as up:
        backend = OpenAIBackend(
            ModelConfig(name="emb", backend="openai", url=f"{up.url}/v1", cost_input_per_1m=1.0), Settings()
        )
        async with gateway_client({"emb": [backend]}) as c:
            r = await c.post("/v1/embeddings", json={"model": "emb", "input": "one two"})
            assert r.status_code == 200, r.text
            assert r.headers["x-tokenops-model"] == "emb" and r.headers["x-tokenops-replica"] == backend.name
            assert "x-tokenops-cost-usd" in r.headers and r.headers["x-tokenops-cache"] == "bypass"
