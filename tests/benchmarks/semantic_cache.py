#!/usr/bin/env python
"""Semantic cache: precision/recall on the labelled pairs, vector-index choice at
100,000 entries, full lookup latency at 100,000 entries, embedder time per query.

    .venv/bin/python tests/benchmarks/semantic_cache.py
    .venv/bin/python tests/benchmarks/semantic_cache.py --entries 100000 --queries 2000 --no-model

1. Quality: every distinct ``a`` prompt of tests/data/semantic_cache_pairs.jsonl is
   cached, every ``b`` looked up (tokenops.semcache.evaluate); for the lexical
   embedder and, when the ``semantic`` extra is installed, all-MiniLM-L6-v2.
2. Index: 100k random unit vectors (384 dims, like MiniLM); queries are stored
   vectors plus noise (cosine ~0.9, a near-duplicate). Flat numpy (one matrix
   product + argmax) against tokenops' partitioned index and, when importable,
   faiss (flat inner product and HNSW). p50/p99 per query and recall@1.
3. Lookup: a SemanticCache holding 100k entries (vectors precomputed, so no
   embedding cost) answers near-duplicate and unrelated questions; p50/p99 of the
   whole lookup (exact-key check, index search, verification).
4. Embedder: time per query of each embedder, reported apart from the lookup.

Times are wall clock and this thread's CPU time (``time.thread_time``): on a
shared, oversubscribed box the wall p99 mostly measures waiting for a core.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PAIRS = ROOT / "tests" / "data" / "semantic_cache_pairs.jsonl"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def fmt_ms(values: list[float], cpu: list[float] | None = None) -> str:
    out = f"wall p50 {pct(values, 0.5) * 1e3:7.3f} ms p99 {pct(values, 0.99) * 1e3:7.3f} ms"
    if cpu:
        out += f" | cpu p50 {pct(cpu, 0.5) * 1e3:6.3f} ms p99 {pct(cpu, 0.99) * 1e3:6.3f} ms"
    return out


def quality(embedders) -> None:
    from tokenops.semcache.cache import CacheConfig, SemanticCache
    from tokenops.semcache.evaluate import load_pairs, score_pairs

    pairs = load_pairs(PAIRS)
    print(f"1. labelled pairs: {sum(p['should_hit'] for p in pairs)} paraphrases, "
          f"{sum(not p['should_hit'] for p in pairs)} look-alikes ({PAIRS.relative_to(ROOT)})")
    for emb in embedders:
        for verified in (True, False):
            s = score_pairs(SemanticCache(emb, CacheConfig(is_verified=verified)), pairs)
            label = "with verifier" if verified else "no verifier  "
            print(f"   {emb.name:<18} threshold {emb.default_threshold:.2f} {label}: precision {s.precision:.3f}  "
                  f"recall {s.recall:.3f}  ({s.num_hits} hits, {len(s.false_hits)} wrong)")


def unit(rng, n: int, dim: int) -> np.ndarray:
    m = rng.standard_normal((n, dim)).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    return m


def near(rng, v: np.ndarray, noise: float = 0.025) -> np.ndarray:
    q = v + noise * rng.standard_normal(v.shape).astype(np.float32)
    return q / np.linalg.norm(q)


def index_choice(n: int, dim: int, num_queries: int, seed: int) -> None:
    from tokenops.semcache.index import VectorIndex

    rng = np.random.default_rng(seed)
    data = unit(rng, n, dim)
    picks = rng.integers(0, n, num_queries)
    queries = [near(rng, data[i]) for i in picks]
    print(f"2. index at {n:,} x {dim} float32, {num_queries} near-duplicate queries "
          f"(mean cosine {float(np.mean([queries[j] @ data[picks[j]] for j in range(50)])):.2f})")

    def bench(name, search):
        times, cpu, hits = [], [], 0
        for q, i in zip(queries, picks):
            t, c = time.perf_counter(), time.thread_time()
            got = search(q)
            cpu.append(time.thread_time() - c)
            times.append(time.perf_counter() - t)
            hits += got == i
        print(f"   {name:<28} {fmt_ms(times, cpu)}   recall@1 {hits / len(queries):.3f}")

    bench("numpy flat (matmul+argmax)", lambda q: int(np.argmax(data @ q)))
    t = time.perf_counter()
    index = VectorIndex(dim)
    for i in range(n):
        index.add(i, data[i])
    build = time.perf_counter() - t
    bench(f"tokenops partitioned ({index.num_cells} cells, nprobe {index.nprobe})",
          lambda q: index.search(q, 1)[0][0])
    print(f"   (partitioned index: {n:,} incremental adds incl. rebuilds took {build:.1f} s)")
    try:
        import faiss  # optional: not a tokenops dependency
    except ImportError:
        print("   faiss: not installed (pip install faiss-cpu to compare)")
        return
    flat = faiss.IndexFlatIP(dim)
    flat.add(data)
    bench("faiss IndexFlatIP", lambda q: int(flat.search(q[None, :], 1)[1][0, 0]))
    hnsw = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(data)
    bench("faiss HNSW (M=32)", lambda q: int(hnsw.search(q[None, :], 1)[1][0, 0]))


class _Precomputed:
    """An embedder that returns stored vectors, so the lookup is timed without embedding."""

    name = "precomputed"
    default_threshold = 0.8

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.vectors: dict[str, np.ndarray] = {}

    def embed(self, texts):
        return np.stack([self.vectors[t] for t in texts])


def lookup_latency(n: int, dim: int, num_queries: int, seed: int) -> None:
    from tokenops.semcache.cache import CacheConfig, SemanticCache
    from tokenops.types import GatewayRequest, GatewayResponse

    rng = np.random.default_rng(seed + 1)
    emb = _Precomputed(dim)
    cache = SemanticCache(emb, CacheConfig(max_bytes=1 << 34))
    data = unit(rng, n, dim)

    def req(text):
        m = [{"role": "user", "content": text}]
        return GatewayRequest(kind="chat", model="m", body={"messages": m}, messages=m, tenant="t")

    t = time.perf_counter()
    for i in range(n):
        q = f"question {i} about item {i}"
        emb.vectors[q] = data[i]
        cache.store(req(q), GatewayResponse(text=f"answer {i}", model="m"))
    fill = time.perf_counter() - t
    times, cpu, hits = [], [], 0
    for j in range(num_queries):
        i = int(rng.integers(n))
        if j % 2:  # a near-duplicate wording of a stored question
            q, v = f"question {i} about item {i}?", near(rng, data[i])
        else:  # an unrelated question
            q, v = f"unrelated question {j}", unit(rng, 1, dim)[0]
        emb.vectors[q] = v
        t, c = time.perf_counter(), time.thread_time()
        response, _ = cache.lookup(req(q))
        cpu.append(time.thread_time() - c)
        times.append(time.perf_counter() - t)
        hits += response is not None
        del emb.vectors[q]
    print(f"3. SemanticCache.lookup with {len(cache):,} entries ({cache.num_bytes / 2**20:.0f} MiB, filled in "
          f"{fill:.0f} s): {fmt_ms(times, cpu)}   hit rate {hits / num_queries:.2f} (half the queries are near-duplicates)")


def embedder_time(embedders, num: int = 50) -> None:
    print("4. embedder time per query (one question, batch of 1)")
    texts = [f"How do I configure the {w} setting on my router number {i}?" for i, w in
             enumerate(["wifi", "dns", "firewall", "vpn", "port"] * (num // 5))]
    for emb in embedders:
        emb.embed(texts[:2])  # warm up
        times, cpu = [], []
        for text in texts:
            t, c = time.perf_counter(), time.thread_time()
            emb.embed([text])
            cpu.append(time.thread_time() - c)
            times.append(time.perf_counter() - t)
        print(f"   {emb.name:<18} {fmt_ms(times, cpu)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--no-model", action="store_true", help="skip all-MiniLM-L6-v2 even when installed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    from tokenops.semcache.embedders import LexicalEmbedder, MiniLMEmbedder

    embedders = [LexicalEmbedder()]
    if not args.no_model and MiniLMEmbedder.is_available():
        import torch

        torch.set_num_threads(args.threads)
        embedders.append(MiniLMEmbedder().load())
    quality(embedders)
    index_choice(args.entries, args.dim, args.queries, args.seed)
    lookup_latency(args.entries, args.dim, args.queries, args.seed)
    embedder_time(embedders)
    print(f"(load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores; "
          f"wall p99 includes time this process waited for a core, cpu is this thread's own time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
