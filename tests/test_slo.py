import pytest

from tokenops.slo import SLOError, parse_slo, parse_slos


@pytest.mark.parametrize(
    "text,metric,pct,seconds",
    [
        ("p95=200ms", "ttft", 95, 0.2),
        ("ttft_p99=0.3s", "ttft", 99, 0.3),
        ("tpot_p95=50ms", "tpot", 95, 0.05),
        ("e2e_p90=2s", "e2e", 90, 2.0),
        ("itl_p99.9=20", "itl", 99.9, 0.02),  # bare number means milliseconds
        (" P50 = 1.5S ", "ttft", 50, 1.5),
    ],
)
def test_parse_valid(text, metric, pct, seconds):
    slo = parse_slo(text)
    assert (slo.metric, slo.percentile) == (metric, pct)
    assert slo.threshold_s == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("", "expected"),
        ("p95", "expected"),
        ("p95=fast", "expected"),
        ("latency_p95=200ms", "unknown metric 'latency'"),
        ("p100=1s", "between 0 and 100"),
        ("p0=1s", "between 0 and 100"),
        ("p95=0ms", "positive"),
        ("p95=200us", "expected"),
        ("p95=-3ms", "expected"),
    ],
)
def test_parse_invalid_has_clear_message(text, fragment):
    with pytest.raises(SLOError) as e:
        parse_slo(text)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_parse_many_and_duplicates():
    slos = parse_slos("p95=200ms,tpot_p95=50ms")
    assert [s.label for s in slos] == ["ttft_p95=200ms", "tpot_p95=50ms"]
    with pytest.raises(SLOError, match="given twice"):
        parse_slos(["p95=200ms", "ttft_p95=1s"])


def test_is_met_boundary():
    slo = parse_slo("p95=200ms")
    assert slo.is_met(0.2) and not slo.is_met(0.2001)
