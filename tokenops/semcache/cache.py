"""The response cache: exact match first, then semantic match with verification.

Entries are partitioned by ``(tenant, model)``: one tenant never sees another's
answers. A semantic match compares the *last user message* (embedded) and
requires the rest of the conversation (system prompt, earlier turns) to be
identical, so the same question in another context is not served. Entries expire
after ``ttl_s`` and the oldest-used are evicted once the total size passes
``max_bytes`` (prompt + answer text + vector + a fixed overhead per entry).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenops.sampling_fields import cache_key_names
from tokenops.semcache.embedders import Embedder, WordSimilarity
from tokenops.semcache.index import VectorIndex
from tokenops.semcache.verifier import Signature, Verifier, signature

#: Bytes charged per entry on top of its texts and vector (dict slots, keys, response object).
ENTRY_OVERHEAD_BYTES = 512
#: Request fields that change the answer and so belong in the exact-match key: the sampling
#: fields their registry marks so, the token limits and the output fields.
_ANSWER_FIELDS = (
    *cache_key_names(),
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "suffix",
    "echo",
)


@dataclass(slots=True)
class CacheConfig:
    #: cosine a semantic hit needs; None: the embedder's calibrated ``default_threshold``
    threshold: float | None = None
    ttl_s: float = 3600.0
    max_bytes: int = 64 * 1024 * 1024
    is_semantic: bool = True
    is_verified: bool = True
    top_k: int = 4
    #: cosine two words' embeddings need to count as synonyms in the verifier (0.0: no synonyms);
    #: above every word swap in the tune look-alikes plus a margin (scripts/tune_semantic_cache.py)
    synonym_threshold: float = 0.65

    def __post_init__(self) -> None:
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"semantic_cache: threshold must be in (0, 1], got {self.threshold}")
        if not 0.0 <= self.synonym_threshold <= 1.0:
            raise ValueError(f"semantic_cache: synonym_threshold must be in [0, 1], got {self.synonym_threshold}")
        if self.ttl_s <= 0 or self.max_bytes <= 0 or self.top_k < 1:
            raise ValueError("semantic_cache: ttl_s, max_bytes and top_k must be > 0")


@dataclass(slots=True)
class _Entry:
    key: int
    partition: tuple[str, str]
    exact_key: str
    context_key: str
    question: str
    signature: Signature
    response: Any
    expires: float
    num_bytes: int


@dataclass(slots=True, frozen=True)
class SharedEntry:
    """A stored answer as it travels between replicas: the keys, the response, the question's
    vector (None without semantic matching) and the seconds it has left to live."""

    partition: tuple[str, str]
    exact_key: str
    context_key: str
    question: str
    response: Any
    vector: Any
    ttl_s: float


@dataclass(slots=True)
class CacheStats:
    lookups: int = 0
    exact_hits: int = 0
    semantic_hits: int = 0
    verifier_rejections: int = 0
    stores: int = 0
    evictions: int = 0
    expirations: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


def split_prompt(request: Any) -> tuple[str, str]:
    """``(context, question)``: everything but the last user turn, and that turn."""
    messages = getattr(request, "messages", None)
    if messages:
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages) - 1)
        content = messages[last].get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        context = json.dumps([m for i, m in enumerate(messages) if i != last], sort_keys=True, default=str)
        return context, str(content or "")
    prompt = getattr(request, "prompt", None)
    return "", prompt if isinstance(prompt, str) else json.dumps(prompt)


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p.encode())
        h.update(b"\x00")
    return h.hexdigest()


class SemanticCache:
    def __init__(
        self, embedder: Embedder, config: CacheConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.embedder = embedder
        self.config = config or CacheConfig()
        self.clock = clock
        self.stats = CacheStats()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU order
        self._exact: dict[str, int] = {}
        self._indexes: dict[tuple[str, str], VectorIndex] = {}
        self._ids = itertools.count()
        self.num_bytes = 0
        self._lock = threading.RLock()
        #: Told of every answer this cache stores and every tenant it drops (a feed to the other
        #: gateway replicas, tokenops/shared_state/redis_cache_feed.py); None: nobody listens.
        self.on_store: Callable[[SharedEntry], None] | None = None
        self.on_delete_tenant: Callable[[str], None] | None = None
        has_words = bool(getattr(embedder, "has_word_similarity", False))
        self.word_similarity = WordSimilarity(embedder) if has_words else None

    def verifier(self) -> Verifier:
        """The verifier for the current config (synonyms only from an embedder that has them)."""
        words = self.word_similarity if self.config.synonym_threshold > 0 else None
        return Verifier(words, synonym_threshold=self.config.synonym_threshold or 1.0)

    @property
    def threshold(self) -> float:
        if self.config.threshold is not None:
            return self.config.threshold
        return float(getattr(self.embedder, "default_threshold", 0.85))

    # -- keys ------------------------------------------------------------------

    @staticmethod
    def keys_of(request: Any) -> tuple[tuple[str, str], str, str, str]:
        """``(partition, exact key, context key, question)`` of a request."""
        partition = (str(request.tenant), str(request.model))
        context, question = split_prompt(request)
        params = json.dumps(
            {k: request.body.get(k) for k in _ANSWER_FIELDS if k in request.body}, sort_keys=True, default=str
        )
        context_key = _digest(request.kind, context, params)
        exact_key = _digest(*partition, context_key, question)
        return partition, exact_key, context_key, question

    # -- lookup ----------------------------------------------------------------

    def lookup(self, request: Any) -> tuple[Any, dict[str, Any]]:
        """``(response or None, decision)``; the decision says exact/semantic hit or why it missed."""
        partition, exact_key, context_key, question = self.keys_of(request)
        now = self.clock()
        with self._lock:
            self.stats.lookups += 1
            hit = self._live(self._exact.get(exact_key), now)
            if hit is not None:
                self.stats.exact_hits += 1
                return hit.response, {"result": "hit", "match": "exact"}
            if not self.config.is_semantic or partition not in self._indexes:
                return None, {"result": "miss"}
        vector = self.embedder.embed([question])[0]
        threshold = self.threshold
        with self._lock:
            index = self._indexes.get(partition)
            candidates = index.search(vector, self.config.top_k) if index is not None else []
            entries = []
            for key, score in candidates:
                if score < threshold:
                    break
                entry = self._live(key, now)
                if entry is not None and entry.context_key == context_key:
                    entries.append((entry, score))
        # verification may embed words (synonyms): outside the lock
        verifier = self.verifier() if self.config.is_verified else None
        mine = signature(question) if verifier is not None else None
        rejected = None
        for entry, score in entries:
            reason = verifier.mismatch(mine, entry.signature) if verifier is not None and mine is not None else None
            if reason is not None:
                rejected = rejected or (reason, score)
                continue
            with self._lock:
                if entry.key not in self._entries:  # dropped meanwhile
                    continue
                self.stats.semantic_hits += 1
            return entry.response, {"result": "hit", "match": "semantic", "similarity": round(score, 4)}
        with self._lock:
            if rejected is not None:
                self.stats.verifier_rejections += 1
                self.stats.by_reason[rejected[0]] = self.stats.by_reason.get(rejected[0], 0) + 1
                return None, {"result": "miss", "rejected": rejected[0], "similarity": round(rejected[1], 4)}
        best = round(candidates[0][1], 4) if candidates else None
        return None, {"result": "miss", "similarity": best}

    def _live(self, key: int | None, now: float) -> _Entry | None:
        if key is None:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            self._drop(entry)
            self.stats.expirations += 1
            return None
        self._entries.move_to_end(key)
        return entry

    # -- store -----------------------------------------------------------------

    def store(self, request: Any, response: Any) -> bool:
        partition, exact_key, context_key, question = self.keys_of(request)
        vector = self.embedder.embed([question])[0] if self.config.is_semantic else None
        shared = SharedEntry(partition, exact_key, context_key, question, response, vector, self.config.ttl_s)
        if not self._keep(shared):
            return False
        if self.on_store is not None:
            self.on_store(shared)
        return True

    def add_shared(self, shared: SharedEntry) -> bool:
        """Keep an answer another replica stored (its vector comes with it: nothing is embedded);
        False when it has expired or is over the byte budget alone."""
        return shared.ttl_s > 0 and self._keep(shared)

    def _keep(self, shared: SharedEntry) -> bool:
        text = getattr(shared.response, "text", "") or ""
        vector = shared.vector if self.config.is_semantic else None
        num_bytes = len(shared.question.encode()) + len(text.encode()) + ENTRY_OVERHEAD_BYTES
        num_bytes += vector.nbytes if vector is not None else 0
        if num_bytes > self.config.max_bytes:
            return False
        with self._lock:
            old = self._exact.get(shared.exact_key)
            if old is not None and old in self._entries:
                self._drop(self._entries[old])
            entry = _Entry(
                next(self._ids),
                shared.partition,
                shared.exact_key,
                shared.context_key,
                shared.question,
                signature(shared.question),
                shared.response,
                self.clock() + min(shared.ttl_s, self.config.ttl_s),
                num_bytes,
            )
            self._add(entry, vector)
        return True

    def _add(self, entry: _Entry, vector: Any) -> None:
        """Index ``entry`` and charge its bytes (under the lock)."""
        self._entries[entry.key] = entry
        self._exact[entry.exact_key] = entry.key
        if vector is not None:
            index = self._indexes.get(entry.partition)
            if index is None:
                index = self._indexes[entry.partition] = VectorIndex(len(vector))
            index.add(entry.key, vector)
        self.num_bytes += entry.num_bytes
        self.stats.stores += 1
        self._evict()

    def set_config(self, config: CacheConfig) -> None:
        """Use ``config`` from now on (a live tunable change); entries over a smaller
        ``max_bytes`` are evicted at once, oldest first."""
        with self._lock:
            self.config = config
            self._evict()

    def _evict(self) -> None:
        now = self.clock()
        while self._entries and self.num_bytes > self.config.max_bytes:
            _, entry = next(iter(self._entries.items()))
            self._drop(entry)
            self.stats.evictions += 1
        # expire a few stale entries from the old end on every store (amortised sweep)
        for _ in range(8):
            if not self._entries:
                break
            _, entry = next(iter(self._entries.items()))
            if entry.expires > now:
                break
            self._drop(entry)
            self.stats.expirations += 1

    def _drop(self, entry: _Entry) -> None:
        self._entries.pop(entry.key, None)
        if self._exact.get(entry.exact_key) == entry.key:
            del self._exact[entry.exact_key]
        index = self._indexes.get(entry.partition)
        if index is not None:
            index.remove(entry.key)
            if not len(index):
                del self._indexes[entry.partition]
        self.num_bytes -= entry.num_bytes

    def delete_tenant(self, tenant: str, *, is_shared: bool = True) -> int:
        """Drop every cached answer of ``tenant`` (all its models); returns how many. The
        other replicas are told unless ``is_shared`` is False (they told this one)."""
        with self._lock:
            doomed = [e for e in self._entries.values() if e.partition[0] == str(tenant)]
            for entry in doomed:
                self._drop(entry)
        if is_shared and self.on_delete_tenant is not None:
            self.on_delete_tenant(str(tenant))
        return len(doomed)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._exact.clear()
            self._indexes.clear()
            self.num_bytes = 0
