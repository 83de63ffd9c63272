"""Prometheus /metrics (vLLM names under tokenops:) and the sliding-window metrics."""

from __future__ import annotations

import re

from tokenops.gateway.observability.metrics_window import MetricsWindow, percentile
from tokenops.gateway.observability.records import RequestRecord
from tokenops.slo import parse_slos
from tokenops.testing_gateway import FakeBackend, gateway_client

NAMES = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prompt_tokens_total",
    "generation_tokens_total",
    "request_success_total",
)


async def test_metrics_exposition_has_vllm_names_labelled_by_model():
    async with gateway_client([FakeBackend(reply="a b c")]) as c:
        for stream in (False, True):
            await c.post(
                "/v1/chat/completions",
                json={"model": "fake-model", "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
            )
        r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in NAMES:
        assert re.search(rf"^tokenops:{name}\S*{{model_name=\"fake-model\"", text, re.M), name
        assert f"# TYPE tokenops:{name}" in text
    assert 'tokenops:request_success_total{model_name="fake-model",finished_reason="stop"} 2' in text
    assert 'tokenops:generation_tokens_total{model_name="fake-model"} 6' in text
    assert 'tokenops:time_to_first_token_seconds_count{model_name="fake-model"} 2' in text
    assert 'tokenops:e2e_request_latency_seconds_bucket{model_name="fake-model",le="+Inf"} 2' in text
    # inter-token gaps come from the streamed request: 3 tokens -> 2 gaps
    assert 'tokenops:inter_token_latency_seconds_count{model_name="fake-model"} 2' in text
    for line in text.splitlines():  # every sample line parses as name{labels} value
        if line and not line.startswith("#"):
            assert re.match(r"^[a-z_:][a-z0-9_:]*(\{[^}]*\})? [-+0-9.e]+(inf)?$", line, re.I), line


def _rec(t_ttft: float, t_e2e: float, ok: bool = True, tokens_out: int = 5) -> RequestRecord:
    rec = RequestRecord(
        id="r",
        kind="chat",
        tenant="t",
        model_requested="m",
        arrival=0.0,
        start=100.0,
        tokens_in=10,
        tokens_out=tokens_out,
        status=200 if ok else 500,
    )
    rec.first_token_at = 100.0 + t_ttft
    rec.end = 100.0 + t_e2e
    return rec


def test_percentile_matches_linear_interpolation():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert abs(percentile(list(range(101)), 95) - 95.0) < 1e-9


def test_window_rates_percentiles_slo_and_expiry():
    w = MetricsWindow(window_s=10, history_s=30, slos=parse_slos(["p50=150ms"]))
    now = 1000.0
    for i in range(10):
        w.add(_rec(0.1 if i < 8 else 0.5, 1.0), now=now - 5 + i * 0.1)
    w.add(_rec(0.1, 1.0, ok=False), now=now - 4)
    snap = w.snapshot(now=now)
    assert snap["requests"]["total"] == 11 and snap["requests"]["errors"] == 1
    assert abs(snap["requests"]["rate_rps"] - 1.1) < 1e-9
    assert abs(snap["tokens"]["output_tps"] - 5.5) < 1e-9
    assert abs(snap["latency"]["ttft"]["p50"] - 0.1) < 1e-9 and abs(snap["latency"]["ttft"]["p99"] - 0.5) < 0.01
    assert abs(snap["latency"]["tpot"]["p50"] - 0.225) < 1e-9  # (1.0 - 0.1) / 4
    target = snap["slo"]["targets"][0]
    assert target["label"] == "ttft_p50=150ms" and target["met"] is True
    assert abs(snap["slo"]["attainment"] - 8 / 11) < 1e-9
    seconds = [p for p in snap["history"] if p["rps"]]
    assert sum(p["rps"] for p in seconds) == 11 and all(p["t"] < now for p in snap["history"])
    later = w.snapshot(now=now + 20)  # past the window: rates drop, totals stay
    assert later["requests"]["rate_rps"] == 0 and later["requests"]["total"] == 11
    assert later["latency"]["e2e"]["p50"] is None
    assert len(later["history"]) == 25  # from the first recorded second (995) up to now (1020)
    assert len(w.snapshot(now=now + 100)["history"]) == 30  # capped at history_s
