"""Small text models for routing: hashed word/character n-gram features, a
multinomial naive-Bayes classifier (request -> capability dimension) and a logistic
regression (request -> probability that the strong model is needed). numpy only."""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field

import numpy as np

NUM_FEATURES = 1 << 14
_WORD = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")


def _bucket(token: str) -> int:
    return zlib.crc32(token.encode()) & (NUM_FEATURES - 1)


def featurize(text: str) -> dict[int, float]:
    """Sparse counts of words, word bigrams, character 4-grams and shape cues."""
    low = text.lower()
    words = _WORD.findall(low)
    feats: dict[int, float] = {}

    def add(tok: str, w: float = 1.0) -> None:
        b = _bucket(tok)
        feats[b] = feats.get(b, 0.0) + w

    for w in words:
        add("w:" + ("<num>" if w.isdigit() else w))
    for a, b in zip(words, words[1:]):
        add(f"b:{a}_{b}")
    for i in range(0, max(0, len(low) - 3), 2):
        add("c:" + low[i : i + 4], 0.25)
    add(f"len:{min(len(text) // 200, 20)}", 2.0)
    add(f"digits:{min(sum(c.isdigit() for c in text) // 4, 10)}")
    return feats


def to_dense(rows: list[dict[int, float]]) -> np.ndarray:
    x = np.zeros((len(rows), NUM_FEATURES), dtype=np.float32)
    for i, row in enumerate(rows):
        for j, v in row.items():
            x[i, j] = v
    return x


@dataclass
class NaiveBayes:
    """Multinomial naive Bayes with Laplace smoothing."""

    labels: list[str] = field(default_factory=list)
    log_prior: np.ndarray | None = None
    log_likelihood: np.ndarray | None = None

    def fit(self, texts: list[str], labels: list[str], alpha: float = 0.5) -> NaiveBayes:
        self.labels = sorted(set(labels))
        x = to_dense([featurize(t) for t in texts])
        y = np.array([self.labels.index(label) for label in labels])
        counts = np.stack([x[y == k].sum(0) for k in range(len(self.labels))]) + alpha
        self.log_likelihood = np.log(counts / counts.sum(1, keepdims=True))
        self.log_prior = np.log(np.bincount(y, minlength=len(self.labels)) / len(y))
        return self

    def predict_proba(self, text: str) -> dict[str, float]:
        assert self.log_likelihood is not None, "fit() first"
        x = to_dense([featurize(text)])[0]
        scores = self.log_prior + self.log_likelihood @ x
        p = np.exp(scores - scores.max())
        p /= p.sum()
        return dict(zip(self.labels, p.tolist()))

    def predict(self, text: str) -> str:
        probs = self.predict_proba(text)
        return max(probs, key=probs.__getitem__)


@dataclass
class Logistic:
    """L2-regularised logistic regression fit by full-batch gradient descent."""

    weights: np.ndarray | None = None
    bias: float = 0.0

    def fit(
        self, texts: list[str], targets: list[float], epochs: int = 300, lr: float = 0.5, l2: float = 1e-3
    ) -> Logistic:
        x = to_dense([featurize(t) for t in texts])
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-6)
        y = np.asarray(targets, dtype=np.float32)
        w = np.zeros(x.shape[1], dtype=np.float32)
        b = 0.0
        for _ in range(epochs):
            p = 1 / (1 + np.exp(-(x @ w + b)))
            g = p - y
            w -= lr * (x.T @ g / len(y) + l2 * w)
            b -= lr * float(g.mean())
        self.weights, self.bias = w, b
        return self

    def predict(self, text: str) -> float:
        assert self.weights is not None, "fit() first"
        x = to_dense([featurize(text)])[0]
        x /= max(float(np.linalg.norm(x)), 1e-6)
        return float(1 / (1 + np.exp(-(x @ self.weights + self.bias))))

    def save(self, path) -> None:
        assert self.weights is not None
        nz = np.flatnonzero(self.weights)
        data = {"bias": self.bias, "index": nz.tolist(), "weight": self.weights[nz].tolist()}
        with open(path, "w") as f:
            json.dump(data, f)

    @classmethod
    def load(cls, path) -> Logistic:
        with open(path) as f:
            data = json.load(f)
        w = np.zeros(NUM_FEATURES, dtype=np.float32)
        w[np.asarray(data["index"], dtype=np.int64)] = np.asarray(data["weight"], dtype=np.float32)
        return cls(weights=w, bias=float(data["bias"]))
