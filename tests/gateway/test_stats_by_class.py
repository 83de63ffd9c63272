"""/admin/stats keeps Batch API lines apart from interactive traffic (issue 55): the window's counts,
tokens, latency percentiles, SLO attainment and history are interactive requests', and batch lines
have their own ``batch`` block. In process (MetricsWindow); the same through a real ``tokenops serve``
is ``tests/gateway/test_priority_classes_serve.py::test_admin_stats_shows_batch_lines_apart``."""

from __future__ import annotations

from tokenops.gateway.observability.metrics_window import MetricsWindow
from tokenops.gateway.observability.records import RequestRecord
from tokenops.slo import parse_slos


def _rec(ttft: float, e2e: float, priority_class: str = "interactive", tokens_out: int = 5) -> RequestRecord:
    rec = RequestRecord(
        id="r", kind="chat", tenant="t", model_requested="m", arrival=0.0, start=100.0,
        tokens_in=10, tokens_out=tokens_out, status=200, priority_class=priority_class,
    )  # fmt: skip
    rec.first_token_at, rec.end = 100.0 + ttft, 100.0 + e2e
    return rec


def test_batch_lines_leave_the_interactive_figures_alone_and_have_their_own_block():
    w = MetricsWindow(window_s=10, history_s=30, slos=parse_slos(["p95=150ms"]))
    now = 1000.0
    for i in range(4):
        w.add(_rec(0.1, 1.0), now=now - 5 + i)
    for i in range(20):  # slow batch lines: they would break the SLO were they counted
        w.add(_rec(3.0, 9.0, "batch", tokens_out=50), now=now - 5 + i * 0.1)
    snap = w.snapshot(now=now)
    assert snap["requests"]["total"] == 4 and abs(snap["requests"]["rate_rps"] - 0.4) < 1e-9
    assert abs(snap["tokens"]["output_tps"] - 2.0) < 1e-9
    assert abs(snap["latency"]["ttft"]["p95"] - 0.1) < 1e-9
    assert snap["slo"]["targets"][0]["met"] is True and snap["slo"]["attainment"] == 1.0
    assert sum(p["rps"] for p in snap["history"]) == 4
    batch = snap["batch"]
    assert batch["requests"]["total"] == 20 and abs(batch["requests"]["rate_rps"] - 2.0) < 1e-9
    assert abs(batch["tokens"]["output_tps"] - 100.0) < 1e-9
    assert abs(batch["latency"]["ttft"]["p95"] - 3.0) < 1e-9
    assert "history" not in batch and "slo" not in batch and "batch" not in batch
    later = w.snapshot(now=now + 30)  # past the window: rates drop, totals stay, as for interactive
    assert later["batch"]["requests"]["rate_rps"] == 0 and later["batch"]["requests"]["total"] == 20
