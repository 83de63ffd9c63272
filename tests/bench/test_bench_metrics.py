"""SLO-aware aggregation on hand-made samples with exact expected figures."""

import math

import pytest

from tokenops.bench.metrics import RequestResult, percentile, slo_value, summarize
from tokenops.slo import parse_slo, parse_slos


def _ok(ttft, e2e, out, itls=None, start=0.0, n_in=10):
    return RequestResult(start_s=start, is_ok=True, ttft_s=ttft, e2e_s=e2e, itls_s=itls or [],
                         num_input_tokens=n_in, num_output_tokens=out)


def test_percentile_linear_interpolation():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([0, 10], 90) == 9.0
    assert percentile([5], 99) == 5.0
    assert percentile([], 50) is None


def test_tpot_excludes_first_token():
    r = _ok(ttft=0.1, e2e=1.1, out=11)
    assert r.tpot_s == pytest.approx(0.1)
    assert _ok(0.1, 0.1, 1).tpot_s is None


def test_summary_percentiles_throughput_and_goodput():
    # 4 requests over 2 s: ttft 0.1 .. 0.4, 5 output tokens each, e2e = ttft + 0.4 (tpot 0.1)
    results = [_ok(t, t + 0.4, 5, itls=[0.1] * 4) for t in (0.1, 0.2, 0.3, 0.4)]
    s = summarize(results, duration_s=2.0, slos=parse_slos(["p50=250ms", "tpot_p95=150ms"]))
    assert s.num_completed == 4 and s.num_errors == 0
    assert s.latency["ttft"]["p50"] == pytest.approx(0.25)
    assert s.latency["ttft"]["p90"] == pytest.approx(0.37)
    assert s.latency["ttft"]["mean"] == pytest.approx(0.25)
    assert s.latency["tpot"]["p99"] == pytest.approx(0.1)
    assert s.latency["itl"]["p50"] == pytest.approx(0.1)
    assert s.request_rate == pytest.approx(2.0)
    assert s.output_tps == pytest.approx(10.0)
    assert s.input_tps == pytest.approx(20.0)
    # per request: ttft <= 0.25 for two of four -> goodput 2 req / 2 s
    assert s.attainment == pytest.approx(0.5)
    assert s.goodput_rps == pytest.approx(1.0)
    assert s.is_slo_met is True  # the p50 is exactly 0.25
    assert [row["met"] for row in s.slo] == [True, True]


def test_errors_count_as_infinitely_slow():
    results = [_ok(0.1, 0.5, 5) for _ in range(9)] + [RequestResult(start_s=0, error="http_500")]
    s = summarize(results, 1.0, slos=[parse_slo("p95=200ms")])
    assert s.num_errors == 1 and s.errors == {"http_500": 1}
    assert s.slo[0]["value_s"] is None and s.slo[0]["met"] is False  # p95 lands on the failed request
    assert s.attainment == pytest.approx(0.9)
    # rank 0.85 * 9 = 7.65 falls among the good requests; 0.9 * 9 = 8.1 reaches the failed one
    assert summarize(results, 1.0, slos=[parse_slo("p85=200ms")]).is_slo_met is True
    assert summarize(results, 1.0, slos=[parse_slo("p90=200ms")]).is_slo_met is False
    assert slo_value(results, parse_slo("p50=1s")) == pytest.approx(0.1)


def test_worst_ratio_and_no_slo():
    results = [_ok(0.3, 0.5, 3)]
    s = summarize(results, 1.0, slos=parse_slos(["p50=100ms", "e2e_p50=1s"]))
    assert s.worst_slo_ratio() == pytest.approx(3.0)
    assert s.is_slo_met is False
    plain = summarize(results, 1.0)
    assert plain.goodput_rps is None and plain.attainment is None and plain.worst_slo_ratio() is None
    assert math.isclose(plain.latency["e2e"]["p99"], 0.5)


def test_roundtrip_dict():
    r = _ok(0.1, 0.2, 2, itls=[0.1])
    assert RequestResult.from_dict(r.to_dict()) == r
