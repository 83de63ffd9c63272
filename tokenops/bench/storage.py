"""Save bench runs into the store (``bench_runs`` / ``bench_results``) and load
them back by id or from a JSON file.

The whole run without per-request samples also goes into ``bench_runs.options``
(JSON), so a stored run can be compared with everything it measured. When the
store file is held by a running server, the run is written as JSON under
``<store dir>/bench-runs/`` instead, where ``compare`` also looks.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

from tokenops.bench.metrics import BenchSummary
from tokenops.bench.results import BenchRun, LevelResult


def _clean(x: Any) -> Any:
    """JSON-safe: infinities become strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def _fallback_dir(store_path: str) -> Path:
    return Path(store_path).expanduser().parent / "bench-runs"


def run_rows(run: BenchRun) -> list[Any]:
    """The ``bench_runs`` row and one ``bench_results`` row per level."""
    from tokenops.store import table_models as m

    ts = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    opts = _clean(
        {
            "model": run.model,
            "settings": run.settings,
            "slos": run.slos,
            "levels": [lv.to_dict(with_requests=False) for lv in run.levels],
        }
    )
    rows: list[Any] = [
        m.BenchRun(id=run.id, ts=ts, target=run.url, workload=run.workload, options=json.dumps(opts), notes=None)
    ]
    for step, lv in enumerate(run.levels):
        s = lv.summary
        rate = s.offered_rate if s.concurrency is None else float(s.concurrency)
        lat = {
            f"{k}_{p}": s.latency[k][p] for k in ("ttft", "tpot", "itl", "e2e") for p in ("p50", "p90", "p95", "p99")
        }
        rows.append(
            m.BenchResult(
                run_id=run.id,
                step=step,
                mode="concurrency" if s.concurrency is not None else run.settings.get("arrival"),
                rate=rate if rate is not None and math.isfinite(rate) else None,
                num_requests=s.num_requests,
                num_errors=s.num_errors,
                duration_s=s.duration_s,
                throughput_rps=s.request_rate,
                input_tok_s=s.input_tps,
                output_tok_s=s.output_tps,
                goodput_rps=s.goodput_rps,
                slo_attainment=s.attainment,
                **lat,
            )
        )
    return rows


def save_run(run: BenchRun, store_path: str, target: Any = None) -> str:
    """Store ``run`` (in ``target``, a :class:`~tokenops.store.run_target.RunTarget`: the measured
    server's store; else ``store_path``); returns where it went (one line for the user)."""
    from tokenops.store import StoreError
    from tokenops.store.run_target import RunTarget, save_rows

    try:
        return f"saved to {save_rows(target or RunTarget(store_path), run_rows(run))} (bench_runs id {run.id})"
    except StoreError as e:
        d = _fallback_dir(store_path)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{run.id}.json"
        run.save_json(path)
        return f"store unavailable ({e}); saved {path}"


def load_run(ref: str, store_path: str) -> BenchRun:
    """A run from a JSON file path, or by id from the store (or its fallback folder)."""
    p = Path(ref)
    if p.suffix == ".json" or p.is_file():
        if not p.is_file():
            raise FileNotFoundError(f"{ref} does not exist")
        return BenchRun.load_json(p)
    fallback = _fallback_dir(store_path) / f"{ref}.json"
    if fallback.is_file():
        return BenchRun.load_json(fallback)
    from tokenops.store import open_store

    store = open_store(store_path, read_only=True)
    try:
        row = store.execute("select id, ts, target, workload, options from bench_runs where id = ?", [ref]).fetchone()
    finally:
        store.close()
    if row is None:
        raise FileNotFoundError(f"no bench run {ref!r} in {store_path}; give a run id or a JSON file")
    opts = json.loads(row[4] or "{}")
    levels = [LevelResult(lv["label"], BenchSummary.from_dict(lv["summary"])) for lv in opts.get("levels", [])]
    return BenchRun(
        url=row[2],
        model=opts.get("model", "?"),
        workload=row[3],
        settings=opts.get("settings", {}),
        slos=opts.get("slos", []),
        levels=levels,
        id=row[0],
        created=str(row[1]),
    )
