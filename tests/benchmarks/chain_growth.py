#!/usr/bin/env python
"""A ``previous_response_id`` chain of N turns of ~200 KB each: the server's RSS, each turn's
time and the bytes the store holds (issue 51, stored chains).

    .venv/bin/python tests/benchmarks/chain_growth.py --turns 40
    .venv/bin/python tests/benchmarks/chain_growth.py --turns 40 --max-chain-bytes 6291456

A real ``tokenops serve`` (its DuckDB store on disk) in front of a chat-only upstream that
echoes the last message (tests/gateway/openai_upstream.py), driven by the openai SDK. A turn
refused for ``max_chain_bytes`` starts a new chain, as the 400 advises. Printed every 5
turns: RSS, the turn's seconds, the prompt the upstream got (messages); at the end the
stored rows' sizes (read from the store once the server stopped). Run it with
``PYTHONPATH`` at an older checkout to measure that one the same way.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--kb", type=int, default=200, help="KB of text per turn")
    ap.add_argument("--max-chain-bytes", type=int, default=None)
    args = ap.parse_args()

    import duckdb
    import openai

    from tests.gateway.openai_upstream import Upstream
    from tokenops.testing_serve import ServeProcess

    extra = f"[gateway]\nmax_chain_bytes = {args.max_chain_bytes}\n\n" if args.max_chain_bytes else ""
    with Upstream() as up:
        config = f'{extra}[[models]]\nname = "up"\nbackend = "openai"\nurl = "{up.url}"\n'
        srv = ServeProcess(tempfile.mkdtemp(prefix="chain-growth-"), config=config)
        with srv:
            client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=600)
            client.responses.create(model="up", input="warm up")
            start = rss_mib(srv.proc.pid)
            filler, previous, peak = "w" * (args.kb * 1024), None, start
            print(f"RSS at start {start:.0f} MiB")
            for i in range(args.turns):
                turn = [{"role": "user", "content": filler}, {"role": "user", "content": f"turn {i}"}]
                t0 = time.monotonic()
                try:
                    previous = client.responses.create(model="up", input=turn, previous_response_id=previous).id
                    note = f"{len(up.bodies[-1]['messages'])} messages sent"
                except openai.BadRequestError as e:
                    previous, note = None, f"400 {e.body['code']}: a new chain"
                seconds = time.monotonic() - t0
                up.bodies.clear()
                peak = max(peak, rss_mib(srv.proc.pid))
                if i % 5 == 4 or note.startswith("400"):
                    print(f"turn {i + 1:3d}: {seconds:6.2f} s  RSS {rss_mib(srv.proc.pid):6.0f} MiB  {note}")
        con = duckdb.connect(str(srv.store_path), read_only=True)
        sizes = [r[0] for r in con.execute("SELECT num_bytes FROM stored_responses ORDER BY created_at").fetchall()]
        con.close()
    big = [s for s in sizes if s > args.kb * 1024]
    print(f"RSS peak {peak:.0f} MiB (+{peak - start:.0f} MiB)")
    print(f"stored: {len(sizes)} rows, {sum(sizes) / 2**20:.1f} MiB; turn rows {min(big)}..{max(big)} bytes")


if __name__ == "__main__":
    main()
