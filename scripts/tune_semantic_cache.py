#!/usr/bin/env python
"""Choose the semantic cache's similarity and synonym thresholds on the *tune* split only.

    .venv/bin/python scripts/tune_semantic_cache.py [--embedder minilm|lexical] [--show-errors]

Reads tests/data/semantic_cache_eval.jsonl, keeps ``split == "tune"`` (the held-out part is
never read here), and prints precision/recall for a grid of (threshold, synonym_threshold),
each pair in its own tenant.

The rules, fixed before the first run:
- ``synonym_threshold``: word-embedding similarity alone cannot tell "buy"/"sell" from
  "buy"/"purchase", so the synonym threshold sits above every word substitution the tune
  look-alikes contain (the words left over after alignment), plus a margin of 0.05,
  rounded up to the grid; a lower value would only be tuned to the words seen here;
- ``threshold``: the highest similarity threshold that keeps the best recall with zero
  false hits (ties go to the stricter setting).
The chosen values are the defaults in tokenops/semcache.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "tests" / "data" / "semantic_cache_eval.jsonl"


class _Memo:
    """Embed each text once across the grid."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.has_word_similarity = getattr(inner, "has_word_similarity", False)
        self.default_threshold = inner.default_threshold
        if hasattr(inner, "word_vectors"):
            self.word_vectors = inner.word_vectors
        self._memo: dict = {}

    def embed(self, texts):
        import numpy as np

        missing = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if missing:
            for t, v in zip(missing, self.inner.embed(missing)):
                self._memo[t] = v
        return np.stack([self._memo[t] for t in texts])


def substitution_similarities(pairs: list[dict], embedder) -> list[float]:
    """Word similarity of each open-class word a look-alike swapped for another."""
    from tokenops.semcache.embedders import WordSimilarity
    from tokenops.semcache.lexicon import OPTIONAL_PARTICLES
    from tokenops.semcache.verifier import _derived, signature

    words = WordSimilarity(embedder.inner)
    out = []
    for r in pairs:
        if r["should_hit"]:
            continue
        ta, tb = list(signature(r["a"]).tokens), list(signature(r["b"]).tokens)
        for t in list(ta):
            m = next((u for u in tb if u.key == t.key), None)
            if m is not None:
                ta.remove(t)
                tb.remove(m)
        left = [t for t in ta + tb if t.key not in OPTIONAL_PARTICLES]
        if not left or any(t.kind != "word" for t in left):
            continue  # told apart without synonyms
        wa, wb = [t for t in ta if t.kind == "word"], [t for t in tb if t.kind == "word"]
        if len(wa) != len(wb):
            continue
        sims = words([t.text for t in wa], [t.text for t in wb])
        out += [float(sims[i][j]) for i, x in enumerate(wa) for j, y in enumerate(wb) if not _derived(x.key, y.key)]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--embedder", default="minilm")
    p.add_argument("--show-errors", action="store_true")
    p.add_argument("--thresholds", type=float, nargs="*", help="similarity thresholds to try (default: a grid)")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    from tokenops.semcache.cache import CacheConfig, SemanticCache
    from tokenops.semcache.embedders import get_embedder
    from tokenops.semcache.evaluate import score_pairs

    pairs = [json.loads(line) for line in EVAL.read_text().splitlines()]
    pairs = [r for r in pairs if r["split"] == "tune"]
    emb = _Memo(get_embedder(args.embedder))
    grid = [0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9] if args.embedder != "lexical" else [0.3, 0.35, 0.4, 0.5, 0.6, 0.7]
    grid = args.thresholds or grid
    synonyms = [0.0]
    if emb.has_word_similarity:
        worst = max(substitution_similarities(pairs, emb), default=0.0)
        pick = next(x for x in (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.83, 0.86, 0.9, 0.95, 1.0)
                    if x >= worst + 0.05)
        print(f"highest word similarity among the tune look-alikes' substitutions: {worst:.3f} -> "
              f"synonym_threshold {pick}")
        synonyms = [0.0, pick]
    best = None
    for threshold in grid:
        for syn in synonyms:
            cache = SemanticCache(emb, CacheConfig(threshold=threshold, synonym_threshold=syn))
            s = score_pairs(cache, pairs, is_isolated=True)
            print(f"threshold {threshold:.2f} synonyms {syn:.2f}: precision {s.precision:.3f} "
                  f"recall {s.recall:.3f} false hits {len(s.false_hits)}", flush=True)
            if not s.false_hits and (best is None or s.recall >= best[0]):
                best = (s.recall, threshold, syn, s)
    if best is None:
        print("no setting without false hits")
        return 1
    recall, threshold, syn, s = best
    print(f"chosen: threshold {threshold} synonym_threshold {syn} (tune recall {recall:.3f})")
    if args.show_errors:
        for a, b, sim, why in s.missed:
            print(f"  missed {sim} {why}: {a!r} / {b!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
