"""``tokenops report`` shows Batch API lines apart from interactive traffic (issue 55)."""

from __future__ import annotations

import json

from store_helpers import DAY1, epoch
from tokenops.cli import build_app
from tokenops.store import Store
from typer.testing import CliRunner


def _seed(path):
    rows = [
        {
            "id": f"i{i}",
            "ts": epoch(DAY1) + i,
            "model_served": "tiny",
            "status": "ok",
            "tokens_in": 10,
            "tokens_out": 20,
            "cost_usd": 0.25,
            "ttft_s": 0.1,
            "e2e_s": 1.0,
            "priority_class": "interactive",
        }
        for i in range(3)
    ]
    rows.append(
        {
            "id": "old",
            "ts": epoch(DAY1),
            "model_served": "tiny",
            "status": "ok",
            "tokens_in": 1,
            "tokens_out": 1,
            "cost_usd": 0.0,
            "ttft_s": 0.1,
            "e2e_s": 1.0,
        }
    )  # before priority_class existed
    rows += [
        {"id": f"b{i}", "ts": epoch(DAY1) + i, "model_served": "tiny", "status": "ok" if i < 4 else "error",
         "tokens_in": 100, "tokens_out": 50, "cost_usd": 0.125, "ttft_s": 2.0, "e2e_s": 3.0,
         "priority_class": "batch", "batch_id": f"batch_{i % 2}"}
        for i in range(5)
    ]  # fmt: skip
    with Store.open(path) as store:
        store.writer().write_many("requests", rows)


def test_batch_lines_apart_from_interactive(tmp_path):
    path = tmp_path / "s.duckdb"
    _seed(path)
    app = build_app()
    data = json.loads(CliRunner().invoke(app, ["report", "--store", str(path), "--since", "all", "--json"]).output)
    by_class = {r[0]: dict(zip(data["usage_by_class"]["columns"], r)) for r in data["usage_by_class"]["rows"]}
    inter, batch = by_class["interactive"], by_class["batch"]
    assert (inter["requests"], inter["tokens_in"], inter["tokens_out"], inter["cost_usd"]) == (4, 31, 61, 0.75)
    assert (batch["requests"], batch["batches"], batch["errors"]) == (5, 2, 1)
    assert (batch["tokens_in"], batch["tokens_out"], batch["cost_usd"]) == (500, 250, 0.625)
    assert batch["ttft_p95"] == 2.0

    out = CliRunner().invoke(app, ["report", "--store", str(path), "--since", "all"]).output
    assert "Interactive and batch traffic" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("batch "))
    assert line.split()[:7] == ["batch", "5", "2", "1", "500", "250", "0.6250"]


def test_no_batch_table_without_batches(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.writer().write_many("requests", [{"id": "a", "ts": epoch(DAY1), "model_served": "tiny", "status": "ok"}])
    out = CliRunner().invoke(build_app(), ["report", "--store", str(path), "--since", "all"]).output
    assert "Interactive and batch traffic" not in out
