"""Plots and comparisons from hand-made runs (no server)."""

import importlib.util

import pytest

from tokenops.bench.metrics import RequestResult, summarize
from tokenops.bench.plot import series, text_plot, write_plot
from tokenops.bench.report import compare_rows
from tokenops.bench.results import BenchRun, LevelResult
from tokenops.slo import parse_slos


def _run(scale: float) -> BenchRun:
    run = BenchRun(url="http://x", model="m", workload="synthetic", settings={}, slos=["ttft_p95=200ms"])
    for rate, ttft in ((1, 0.05), (2, 0.08), (4, 0.4)):
        res = [RequestResult(start_s=0, is_ok=True, ttft_s=ttft * scale, e2e_s=ttft * scale + 0.5,
                             num_output_tokens=6, num_input_tokens=4) for _ in range(4)]
        run.levels.append(LevelResult(f"rate {rate}/s", summarize(res, 4 / rate, parse_slos(["p95=200ms"]),
                                                                   offered_rate=rate)))
    return run


def test_series_and_text_plot():
    run = _run(1.0)
    pts = series(run)["ttft p95"]
    assert pts == [(1.0, pytest.approx(50)), (2.0, pytest.approx(80)), (4.0, pytest.approx(400))]
    txt = text_plot(run, width=40, height=8)
    lines = txt.splitlines()
    assert len(lines) == 8 + 3 and "requests/s" in lines[-2]
    assert lines[0].strip().startswith("900.0")  # the top of the axis is the largest value (e2e p95 = 0.9 s)
    single = BenchRun(url="u", model="m", workload="w", settings={}, levels=run.levels[:1])
    assert text_plot(single) == ""


def test_html_plot_and_png_without_matplotlib(tmp_path):
    run = _run(1.0)
    html = write_plot(run, tmp_path / "p.html").read_text()
    assert html.count("<polyline") == 4 and "SLO ttft_p95=200ms" in html
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(ValueError, match="matplotlib"):
            write_plot(run, tmp_path / "p.png")
    with pytest.raises(ValueError, match=".html or .png"):
        write_plot(run, tmp_path / "p.svg")


def test_compare_rows_relative_change():
    rows = compare_rows(_run(1.0), _run(2.0))
    ttft = [r for r in rows if r["figure"] == "ttft p95 (ms)"]
    assert [r["change"] for r in ttft] == [pytest.approx(1.0)] * 3
    rps = [r for r in rows if r["figure"] == "req/s"]
    assert all(r["change"] == pytest.approx(0.0) for r in rps)


def test_slo_presets(tmp_path, monkeypatch):
    from tokenops.bench.slo_presets import list_presets, load_preset, resolve
    from tokenops.slo import SLOError

    assert load_preset("interactive") == ["ttft_p95=200ms", "tpot_p95=50ms"]
    assert {"interactive", "relaxed", "batch"} <= set(list_presets())
    assert resolve(["ttft_p95=300ms"], "interactive") == ["tpot_p95=50ms", "ttft_p95=300ms"]
    with pytest.raises(SLOError, match="unknown SLO preset"):
        load_preset("nope")
    monkeypatch.chdir(tmp_path)  # a project's own presets come first
    (tmp_path / "profiles" / "slo").mkdir(parents=True)
    (tmp_path / "profiles" / "slo" / "interactive.toml").write_text('slo = ["p99=1s"]\n')
    assert load_preset("interactive") == ["p99=1s"]
