"""``tokenops report`` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tokenops.cli import build_app
from tokenops.store import Store

from store_helpers import DAY1, epoch


@pytest.fixture(scope="module")
def app():
    return build_app()


def _invoke(app, *args):
    return CliRunner().invoke(app, ["report", *args])


def _seed(path):
    with Store.open(path) as store:
        w = store.writer()
        w.write_many("requests", [
            {"id": f"r{i}", "ts": epoch(DAY1) + i, "model_served": "tiny", "status": "ok", "tokens_in": 10,
             "tokens_out": 20, "cost_usd": 0.25, "ttft_s": 0.1 * (i + 1), "e2e_s": 1.0, "cache_hit": i == 0}
            for i in range(4)
        ])


def test_missing_store_says_nothing_recorded(app, tmp_path):
    result = _invoke(app, "--store", str(tmp_path / "none.duckdb"))
    assert result.exit_code == 0
    assert result.output.strip() == f"no requests recorded yet in {tmp_path / 'none.duckdb'}"
    assert not (tmp_path / "none.duckdb").exists()  # a report never creates the file


def test_empty_store_says_nothing_recorded(app, tmp_path):
    path = tmp_path / "empty.duckdb"
    Store.open(path).close()
    result = _invoke(app, "--store", str(path), "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["requests"] == 0 and data["message"].startswith("no requests recorded yet")


def test_report_tables_and_json(app, tmp_path):
    path = tmp_path / "s.duckdb"
    _seed(path)
    result = _invoke(app, "--store", str(path), "--since", "2026-11-01")
    assert result.exit_code == 0, result.output
    assert "4 requests since 2026-11-01T00:00:00 UTC: 40 tokens in, 80 tokens out, $1.0000" in result.output
    assert "2026-11-01" in result.output and "tiny" in result.output
    assert "25.0%" in result.output  # gateway cache: 1 hit of 4

    data = json.loads(_invoke(app, "--store", str(path), "--since", "2026-11-01", "--json").output)
    usage = dict(zip(data["usage_by_model_day"]["columns"], data["usage_by_model_day"]["rows"][0]))
    assert (usage["requests"], usage["tokens_in"], usage["tokens_out"], usage["cost_usd"]) == (4, 40, 80, 1.0)
    assert usage["ttft_p50"] == pytest.approx(0.25)
    assert data["cache_hit_rates"]["rows"] == [["gateway", "tiny", 4, 1, 0.25]]


def test_window_without_requests_points_at_since(app, tmp_path):
    path = tmp_path / "s.duckdb"
    _seed(path)
    result = _invoke(app, "--store", str(path), "--since", "1h")
    assert result.exit_code == 0
    assert "no requests since" in result.output and "(4 older); widen --since" in result.output


def test_bad_since_is_one_line(app, tmp_path):
    path = tmp_path / "s.duckdb"
    _seed(path)
    result = _invoke(app, "--store", str(path), "--since", "last tuesday")
    assert result.exit_code == 2
    assert "cannot read since='last tuesday'" in result.output


def test_report_reads_the_store_path_from_the_environment(app, tmp_path, monkeypatch):
    path = tmp_path / "env.duckdb"
    _seed(path)
    monkeypatch.setenv("TOKENOPS_STORE", str(path))
    data = json.loads(_invoke(app, "--since", "all", "--json").output)
    assert data["store"] == str(path) and data["requests"] == 4


def test_report_shows_routing_escalations_and_ensemble_members(app, tmp_path):
    path = tmp_path / "r.duckdb"
    with Store.open(path) as store:
        w = store.writer()
        w.write_many("requests", [
            {"id": "c1", "ts": epoch(DAY1), "model_requested": "cascade", "model_served": "big", "router": "cascade",
             "route_reason": "cascade: tier 1 of 2:escalated", "escalated": True, "status": "ok"},
            {"id": "e1", "ts": epoch(DAY1) + 1, "model_requested": "ensemble:vote", "model_served": "small",
             "router": "ensemble", "route_reason": "ensemble: vote over 3", "ensemble_members": ["small", "small", "small"],
             "status": "ok"},
        ])
    data = json.loads(_invoke(app, "--store", str(path), "--since", "2026-11-01", "--json").output)
    routes = [dict(zip(data["route_reasons"]["columns"], r)) for r in data["route_reasons"]["rows"]]
    by_router = {r["router"]: r for r in routes}
    assert by_router["cascade"]["escalated"] == 1 and by_router["cascade"]["model_served"] == "big"
    assert json.loads(by_router["ensemble"]["ensemble_members"]) == ["small", "small", "small"]
    text = _invoke(app, "--store", str(path), "--since", "2026-11-01").output
    assert "Routing" in text and "ensemble: vote over 3" in text and "cascade" in text
