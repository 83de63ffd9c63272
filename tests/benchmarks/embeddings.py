"""Embeddings through ``tokenops serve`` vs the same model called in-process.

Starts ``tokenops serve`` with the packaged all-MiniLM-L6-v2 as an ``embedding`` model,
sends ShareGPT-like sentences with the openai SDK (one input per request, then batches),
and embeds the same inputs with sentence-transformers directly in this process (the
peer: what the gateway adds is HTTP, JSON/base64, admission and telemetry). Prints
texts/s and per-request latency for both, their ratio, and checks the vectors agree.

    .venv/bin/python tests/benchmarks/embeddings.py [--requests 64] [--batch 16] [--rounds 4] [--threads 1] [--json]

Both sides use the same number of torch threads (``--threads``; the server through
``OMP_NUM_THREADS``), and the runs alternate in rounds (direct, gateway, direct, ...)
so that load from other processes falls on both; the figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

WORDS = ("the model answers questions about cats dogs weather cities numbers travel food code music history "
         "science planets rivers mountains books films games sports markets").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40))) + f" #{i}" for i in range(n)]


def measure(fn, items: list) -> tuple[float, list[float]]:
    lat = []
    t0 = time.perf_counter()
    for item in items:
        t = time.perf_counter()
        fn(item)
        lat.append(time.perf_counter() - t)
    return time.perf_counter() - t0, lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64, help="single-input requests (default 64)")
    ap.add_argument("--batch", type=int, default=16, help="inputs per request in the batched run (default 16)")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per side (default 4)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on each side (default 1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if min(args.requests, args.batch, args.rounds, args.threads) < 1:
        ap.error("--requests, --batch, --rounds and --threads must be >= 1")

    import numpy as np
    import openai

    from tokenops.backends.embedding import _load, is_default_available
    from tokenops.testing_serve import ServeProcess

    if not is_default_available():
        sys.exit("error: needs the semantic extra (pip install 'tokenops[semantic]')")
    import torch

    torch.set_num_threads(args.threads)
    texts = sentences(args.requests)
    shapes = {"1 input/request": texts, f"{args.batch} inputs/request":
              [texts[i:i + args.batch] for i in range(0, len(texts), args.batch)]}
    direct = _load(None, "cpu")
    direct.encode(texts[:4], normalize_embeddings=True)  # warm-up
    samples: dict[tuple[str, str], list[tuple[float, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config = '[[models]]\nname = "minilm"\nbackend = "embedding"\n'
        with ServeProcess(tmp, config=config, store=False, env={"OMP_NUM_THREADS": str(args.threads)}) as srv:
            client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
            client.embeddings.create(model="minilm", input=texts[:4])  # warm-up
            sides = {"in-process sentence-transformers": lambda x: direct.encode(
                         x if isinstance(x, list) else [x], normalize_embeddings=True, show_progress_bar=False),
                     "tokenops serve + openai SDK": lambda x: client.embeddings.create(model="minilm", input=x)}
            for _ in range(args.rounds):
                for label, items in shapes.items():
                    for who, fn in sides.items():
                        samples.setdefault((who, label), []).append(measure(fn, items))
            got = np.array([d.embedding for d in client.embeddings.create(model="minilm", input=texts[:8]).data])
    rows = {}
    for key, runs in samples.items():
        wall = statistics.median(w for w, _ in runs)
        lat = [x for _, lats in runs for x in lats]
        rows[key] = (wall, lat, len(texts))
    want = direct.encode(texts[:8], normalize_embeddings=True)
    max_diff = float(np.abs(got - want).max())
    out = []
    for (who, label), (wall, lat, n) in rows.items():
        out.append({"client": who, "shape": label, "texts_per_s": n / wall,
                    "p50_ms": statistics.median(lat) * 1e3, "p95_ms": sorted(lat)[int(0.95 * (len(lat) - 1))] * 1e3})
    if args.json:
        print(json.dumps({"rows": out, "max_abs_diff": max_diff}, indent=2))
        return
    print(f"{'client':<34} {'shape':<20} {'texts/s':>9} {'p50 ms':>8} {'p95 ms':>8}")
    for r in out:
        print(f"{r['client']:<34} {r['shape']:<20} {r['texts_per_s']:>9.1f} {r['p50_ms']:>8.1f} {r['p95_ms']:>8.1f}")
    for label in ("1 input/request", f"{args.batch} inputs/request"):
        g = next(r for r in out if r["shape"] == label and r["client"].startswith("tokenops"))
        d = next(r for r in out if r["shape"] == label and r["client"].startswith("in-process"))
        print(f"{label}: tokenops serve reaches {g['texts_per_s'] / d['texts_per_s']:.2f}x the in-process rate "
              f"(+{g['p50_ms'] - d['p50_ms']:.1f} ms p50 per request)")
    print(f"vectors: max |gateway - in-process| = {max_diff:.2e}")


if __name__ == "__main__":
    main()
