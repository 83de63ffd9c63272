"""What a ``previous_response_id`` turn costs in the store, embedded DuckDB against PostgreSQL
(``[shared] postgres_url``): the Responses route's three store calls per turn (``head``,
``conversation``, ``save``), timed on a chain that grows turn by turn.

PostgreSQL is a throwaway server from Debian's package on loopback (tokenops/testing_postgres.py:
no fsync), DuckDB a store file in a temporary folder, so the figures are the stores' own work
and one loopback round trip per call, not a network's.

    .venv/bin/python tests/benchmarks/shared_chain_reads.py --turns 40 --turn-bytes 10000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenops.shared_settings import SharedSettings
from tokenops.shared_state import ResponseStore, open_response_store
from tokenops.store import Store
from tokenops.store.stored_responses import Limits
from tokenops.testing_postgres import postgres_server


def _chain(rs: ResponseStore, turns: int, turn_bytes: int) -> list[float]:
    """Seconds of each turn's three store calls."""
    out, previous = [], None
    for i in range(turns):
        started = time.perf_counter()
        history: list[dict[str, Any]] = []
        if previous is not None:
            assert rs.head("t", previous) is not None
            history = rs.conversation("t", previous)
        own = [{"type": "message", "role": "user", "content": "x" * turn_bytes}]
        response = {"id": f"resp_{i:04d}", "model": "m", "output": [{"type": "message", "content": f"answer {i}"}]}
        assert rs.save("t", response, history + own, previous, len(history))
        out.append(time.perf_counter() - started)
        previous = response["id"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--turn-bytes", type=int, default=10_000)
    args = ap.parse_args()
    limits = Limits(max_chain_bytes=1 << 30, max_response_bytes=1 << 26)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "t.duckdb")
        results["embedded (DuckDB)"] = _chain(open_response_store(SharedSettings(), limits, store), args.turns,
                                              args.turn_bytes)
        store.close()
    with postgres_server() as url:
        rs = open_response_store(SharedSettings(postgres_url=url), limits)
        rs.head("t", "warm-up")  # connects and creates the table
        results["shared (PostgreSQL)"] = _chain(rs, args.turns, args.turn_bytes)
    print(f"{args.turns} turns of {args.turn_bytes} bytes in one chain; head + conversation + save per turn")
    print(f"{'store':<22}{'median ms':>12}{'last 5 ms':>12}")
    for name, times in results.items():
        print(f"{name:<22}{statistics.median(times) * 1e3:>12.1f}{statistics.median(times[-5:]) * 1e3:>12.1f}")


if __name__ == "__main__":
    main()
