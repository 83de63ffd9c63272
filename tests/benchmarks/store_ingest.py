"""Store benchmark: telemetry ingest rate and an analytic query over 10M requests.

Prints
- rows/s through the batched ``TelemetryWriter`` (goal >= 100,000 rows/s on a
  2-core machine), next to DuckDB's ``executemany`` on the same rows (the naive
  peer the writer's column-wise path replaces);
- the time of a p95-TTFT-by-model-by-hour query, and of the named query
  ``latency_by_model_hour``, over 10,000,000 ``requests`` rows generated with
  DuckDB SQL (goal < 1 s).

Wall-clock figures depend on what else runs on the machine, so each line also
gives the process CPU seconds (all threads) and the load average: on a busy
shared box the CPU figures show what an idle machine would do.

Run: ``.venv/bin/python tests/benchmarks/store_ingest.py [--ingest-rows N] [--query-rows N]``
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from tokenops.store import Store

MODELS = ["llama-3-8b", "qwen2.5-7b", "mistral-7b", "tiny-demo"]

P95_TTFT_BY_MODEL_HOUR = """
SELECT model_served, date_trunc('hour', ts) AS hour, quantile_cont(ttft_s, 0.95) AS ttft_p95
FROM requests WHERE status = 'ok'
GROUP BY ALL
"""


def _request_rows(n: int) -> list[dict]:
    """Rows shaped like the gateway's: every column a request row usually carries."""
    rng = random.Random(0)
    now = time.time()
    rows = []
    for i in range(n):
        model = MODELS[i % len(MODELS)]
        ttft = rng.uniform(0.02, 0.5)
        rows.append({
            "id": f"req-{i:024x}", "ts": now + i * 1e-4, "tenant": "default", "api_key_id": "k1",
            "model_requested": model, "model_served": model, "backend": "local", "route_reason": "by-name",
            "router": "route_by_name", "replica": f"{model}/0", "cache_hit": i % 11 == 0, "escalated": False,
            "tokens_in": rng.randint(20, 2000), "tokens_out": rng.randint(10, 500), "tokens_cached": 0,
            "ttft_s": ttft, "tpot_s": rng.uniform(0.01, 0.05), "e2e_s": ttft + rng.uniform(0.5, 5.0),
            "status": "ok", "error_kind": None, "http_status": 200, "stream": i % 2 == 0, "cost_usd": 1e-4,
            "decisions": '{"route": "by-name", "replica": "round_robin"}',
        })
    return rows


def bench_ingest(folder: Path, num_rows: int) -> tuple[float, float, float, float]:
    """(writer rows/s end to end, rows per CPU-second, producer enqueue rows/s, executemany rows/s)."""
    rows = _request_rows(num_rows)
    with Store.open(folder / "ingest.duckdb") as store:
        writer = store.writer(flush_interval_s=0.5)
        cpu_started = time.process_time()
        started = time.perf_counter()
        for row in rows:
            writer.write("requests", row)
        enqueued = time.perf_counter()
        writer.flush()
        done = time.perf_counter()
        cpu_rate = num_rows / (time.process_time() - cpu_started)
        assert store.execute("SELECT count(*) FROM requests").fetchone()[0] == num_rows
        writer_rate = num_rows / (done - started)
        enqueue_rate = num_rows / (enqueued - started)

        sample = rows[: min(2_000, num_rows)]
        columns = list(sample[0])
        sql = f"INSERT INTO requests ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
        values = [[r[c] for c in columns] for r in sample]
        for v in values:
            v[1] = None  # epoch floats are not timestamps; the writer converts them, executemany cannot
        cur = store.connection.cursor()
        started = time.perf_counter()
        cur.execute("BEGIN TRANSACTION")
        cur.executemany(sql, values)
        cur.execute("COMMIT")
        executemany_rate = len(values) / (time.perf_counter() - started)
    return writer_rate, cpu_rate, enqueue_rate, executemany_rate


def _generate(store: Store, num_rows: int) -> None:
    """``num_rows`` requests over the last 7 days, generated inside DuckDB."""
    models = "[" + ", ".join(f"'{m}'" for m in MODELS) + "]"
    store.execute(f"""
        INSERT INTO requests
        SELECT 'req-' || i, TIMESTAMP '2026-11-14 00:00:00' + to_microseconds(CAST(i * (604800e6 / {num_rows}) AS BIGINT)),
               'tenant-' || (i % 5), NULL, m, m, 'local', 'by-name', 'route_by_name', m || '/0',
               i % 11 = 0, FALSE, NULL,
               20 + i % 2000, 10 + i % 500, 0,
               0.02 + random() * 0.5, 0.01 + random() * 0.04, 1.0 + random() * 5,
               CASE WHEN i % 100 = 0 THEN 'error' ELSE 'ok' END, NULL, 200, i % 2 = 0, 1e-4, NULL
        FROM (SELECT i, {models}[1 + i % {len(MODELS)}] AS m FROM range({num_rows}) t(i))
    """)
    store.execute("CHECKPOINT")


def bench_query(folder: Path, num_rows: int, repeats: int = 3) -> dict[str, float]:
    path = folder / "query.duckdb"
    started = time.perf_counter()
    with Store.open(path) as store:
        _generate(store, num_rows)
    generated_s = time.perf_counter() - started
    out = {"generate_s": generated_s}
    with Store.open(path, read_only=True) as store:
        assert store.execute("SELECT count(*) FROM requests").fetchone()[0] == num_rows
        for label, run in (
            ("p95_ttft_by_model_hour", lambda: store.execute(P95_TTFT_BY_MODEL_HOUR).fetchall()),
            ("latency_by_model_hour", lambda: store.run_query("latency_by_model_hour", since="all")),
        ):
            times, cpu = [], []
            for _ in range(repeats):
                c, t = time.process_time(), time.perf_counter()
                result = run()
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            num_groups = len(result["rows"]) if isinstance(result, dict) else len(result)
            assert num_groups == 7 * 24 * len(MODELS), num_groups
            out[f"{label}_first_s"] = times[0]
            out[f"{label}_best_s"] = min(times)
            out[f"{label}_cpu_s"] = min(cpu)
    return out


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ingest-rows", type=int, default=500_000)
    parser.add_argument("--query-rows", type=int, default=10_000_000)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tokenops-store-bench-"))
    try:
        print(f"machine {os.cpu_count()} CPUs, load average {_load()} at start")
        writer_rate, cpu_rate, enqueue_rate, executemany_rate = bench_ingest(folder, args.ingest_rows)
        ok = "PASS" if writer_rate >= 100_000 else "FAIL"
        print(f"ingest  TelemetryWriter: {writer_rate:>10,.0f} rows/s end to end ({args.ingest_rows:,} request rows; "
              f"goal >= 100,000: {ok}); {cpu_rate:,.0f} rows per CPU-second; load {_load()}")
        print(f"ingest  producer write(): {enqueue_rate:>9,.0f} rows/s (time the caller spends queueing)")
        print(f"ingest  peer: DuckDB executemany {executemany_rate:>8,.0f} rows/s "
              f"(writer is {writer_rate / executemany_rate:.0f}x faster)")
        print(f"query   generating {args.query_rows:,} requests rows with DuckDB SQL ...", flush=True)
        q = bench_query(folder, args.query_rows)
        print(f"query   generated {args.query_rows:,} requests rows in {q['generate_s']:.1f} s (DuckDB SQL)")
        for label in ("p95_ttft_by_model_hour", "latency_by_model_hour"):
            best = q[f"{label}_best_s"]
            ok = "PASS" if best < 1.0 else "FAIL"
            print(f"query   {label}: best {best:.3f} s, first {q[f'{label}_first_s']:.3f} s "
                  f"(672 groups; goal < 1 s: {ok}); CPU {q[f'{label}_cpu_s']:.3f} s over DuckDB's threads; load {_load()}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
