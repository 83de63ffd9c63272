"""Semantic router: route to the model of the nearest labelled example prompts.

```toml
[plugins.router]
use = "semantic"
default = "small"
[plugins.router.semantic]
embedder = "auto"        # auto (all-MiniLM-L6-v2 with the `semantic` extra, else lexical) | minilm | lexical
min_similarity = 0.35    # below this, the default model
k = 3                    # neighbours that vote (similarity-weighted)
[[plugins.router.semantic.routes]]
model = "big"
examples = ["Prove that the square root of 2 is irrational.", "Write a Python function that parses ISO dates."]
[[plugins.router.semantic.routes]]
model = "small"
examples = ["Translate 'good morning' to French.", "Is this review positive or negative?"]
```
"""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np
from tokenops import hookimpl, may_block
from tokenops.types import RouteDecision

from ._router_config import RouterConfig

TOKENOPS_LAYER = "multi_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"router": ("use", "alias", "default", "semantic")}


class ExampleIndex:
    """Labelled example prompts embedded once; ``nearest`` votes among the top k."""

    def __init__(self, routes: list[dict], embedder_name: str = "auto"):
        from tokenops.semcache.embedders import get_embedder

        self.embedder = get_embedder(embedder_name)
        self.labels = [r["model"] for r in routes for _ in r.get("examples", [])]
        texts = [e for r in routes for e in r.get("examples", [])]
        if not texts:
            raise ValueError("[plugins.router.semantic] needs routes with examples")
        self.vectors = self.embedder.embed(texts)

    def nearest(self, text: str, k: int = 3) -> tuple[str, float]:
        sims = self.vectors @ self.embedder.embed([text])[0]
        top = np.argsort(-sims)[:k]
        votes: dict[str, float] = defaultdict(float)
        for i in top:
            votes[self.labels[i]] += float(max(sims[i], 0.0))
        best = max(votes, key=votes.__getitem__)
        return best, float(max(sims[i] for i in top if self.labels[i] == best))


class SemanticRouter:
    """The semantic router of one gateway: its ``[plugins.router]`` and its example index."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.rc = RouterConfig()
        self.index: ExampleIndex | None = None
        self._lock = threading.Lock()

    def get_index(self) -> ExampleIndex:
        with self._lock:
            if self.index is None:
                conf = self.rc.section("semantic")
                self.index = ExampleIndex(conf.get("routes", []), conf.get("embedder", "auto"))
            return self.index

    @hookimpl
    def tokenops_configure(self, settings):
        self.rc.configure(settings)
        self.index = None

    def is_active(self, request) -> bool:
        return self.rc.is_active("semantic", request)

    @hookimpl
    @may_block(when=lambda self, request: self.is_active(request))  # embeds the prompt: routed in a worker thread
    def tokenops_route(self, request, candidates, profiles):
        if not self.is_active(request):
            return None
        conf = self.rc.section("semantic")
        model, sim = self.get_index().nearest(request.prompt_text(), int(conf.get("k", 3)))
        threshold = float(conf.get("min_similarity", 0.35))
        if sim >= threshold and model in candidates:
            return RouteDecision(
                model, f"semantic: nearest examples -> {model} (similarity {sim:.2f})", router="semantic", score=sim
            )
        default = self.rc.default_model(candidates)
        if default is None:
            return None
        return RouteDecision(
            default,
            f"semantic: no example within {threshold:.2f} (best {sim:.2f}), default",
            router="semantic",
            score=sim,
        )
