"""``tokenops report --store a --store b``: several gateway replicas' stores read as one
(tokenops/store/merged_telemetry.py), and how long the merge takes (printed)."""

from __future__ import annotations

import json
import time

from typer.testing import CliRunner

from tokenops.cli import build_app
from tokenops.store import Store
from tokenops.store.merged_telemetry import merged_requests
from tokenops.store.queries import parse_since

from store_helpers import DAY1, epoch


def _seed(path, replica: str, n: int, cost: float) -> None:
    with Store.open(path) as store:
        store.writer().write_many("requests", [
            {"id": f"{replica}-{i}", "ts": epoch(DAY1) + i, "model_served": "tiny", "status": "ok", "tokens_in": 10,
             "tokens_out": 20, "cost_usd": cost, "ttft_s": 0.1, "e2e_s": 1.0, "cache_hit": i % 2 == 0}
            for i in range(n)
        ])


def test_two_replicas_stores_make_one_report(tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _seed(a, "a", 4, 0.25)
    _seed(b, "b", 6, 0.5)
    app = build_app()
    result = CliRunner().invoke(app, ["report", "--store", str(a), "--store", str(b), "--since", "2026-11-01",
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["requests"] == 10 and data["cost_usd"] == 4.0 and data["tokens_in"] == 100
    assert data["stores"] == [{"store": str(a), "requests": 4}, {"store": str(b), "requests": 6}]
    assert data["cache_hit_rates"]["rows"][0][2:4] == [10, 5]
    text = CliRunner().invoke(app, ["report", "--store", str(a), "--store", str(b), "--since", "2026-11-01"]).output
    assert "10 requests since" in text and f"{a}: 4" in text and f"{b}: 6" in text
    missing = CliRunner().invoke(app, ["report", "--store", str(a), "--store", str(tmp_path / "c.duckdb")])
    assert missing.exit_code == 2 and "no store at" in missing.output


def test_merge_cost_is_printed(tmp_path):
    paths = [tmp_path / f"{r}.duckdb" for r in "abc"]
    for n, path in enumerate(paths):
        _seed(path, "abc"[n], 20_000, 0.01)
    started = time.perf_counter()
    merged, counts = merged_requests(paths, parse_since("2026-11-01"))
    seconds = time.perf_counter() - started
    with merged:
        assert [c["requests"] for c in counts] == [20_000] * 3
        assert merged.execute("SELECT count(DISTINCT id) FROM requests").fetchone()[0] == 60_000
    print(f"merged 3 stores x 20,000 requests in {seconds:.2f} s (shared box)")
