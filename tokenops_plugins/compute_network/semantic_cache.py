"""Semantic response cache: exact match, then embedding similarity above a
threshold plus a verifier that aligns the two prompts' content tokens (every word,
particle, negator, number, modal and tense marker matched by itself or a synonym,
operand order kept; docs/semantic-cache.md); TTL, a byte budget, isolation per tenant
and model. Off unless ``[plugins.semantic_cache]`` is configured (``enabled = true``,
``threshold``, ``synonym_threshold``, ``ttl_s``, ``max_bytes``,
``embedder = "auto"|"minilm"|"lexical"``, ``semantic``) or the ``cache.enabled``
tunable is switched on.

A request opts out with the header ``x-tokenops-cache: off`` or ``"cache": false``
in its body (neither looked up nor stored). The outcome goes to
``request.decisions["semantic_cache"]`` (a key this plugin declares).

Each gateway has its own :class:`SemanticCachePlugin` instance, and so its own cache.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from tokenops import hookimpl, may_block
from tokenops.semcache.cache import CacheConfig, SemanticCache
from tokenops.semcache.embedders import get_embedder
from tokenops.tunables import Tunable, TunableError

TOKENOPS_LAYER = "compute_network"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {
    "semantic_cache": ("enabled", "embedder", "semantic", *(f.name for f in dataclasses.fields(CacheConfig)))
}

_FIELDS = {
    "cache.semantic_threshold": "threshold",
    "cache.ttl_s": "ttl_s",
    "cache.max_bytes": "max_bytes",
    "cache.semantic": "is_semantic",
    "cache.synonym_threshold": "synonym_threshold",
}
_OFF = ("off", "false", "0", "no", "no-cache", "no-store", "bypass")


class SemanticCachePlugin:
    """One gateway's semantic cache and its configuration."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.cache: SemanticCache | None = None
        self._embedder_name = "auto"
        self._shared: Any = None  # [shared] of the settings: a redis_url feeds the cache across replicas
        self._feed: Any = None

    def configure(self, config: CacheConfig | None = None, embedder=None, **kw) -> SemanticCache:
        """Install a cache (tests pass an embedder and clock); returns it. With ``[shared] redis_url``
        it is fed from and to the other gateway replicas (tokenops/shared_state/redis_cache_feed.py)."""
        self.disable()
        self.cache = SemanticCache(embedder or get_embedder(self._embedder_name), config or CacheConfig(), **kw)
        if self._shared is not None:
            from tokenops.shared_state import open_cache_feed

            self._feed = open_cache_feed(self._shared, self.cache)
        return self.cache

    def disable(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        self.cache = None

    @hookimpl
    def tokenops_register_decisions(self, register):
        register("semantic_cache", dict[str, Any])  # the lookup: result, similarity, match, ...

    @hookimpl
    def tokenops_configure(self, settings):
        self._shared = getattr(settings, "shared", None)
        raw = dict(settings.plugin_settings("semantic_cache"))
        if not raw or not raw.pop("enabled", True):
            return
        self._embedder_name = str(raw.pop("embedder", "auto"))
        if "semantic" in raw:
            raw["is_semantic"] = bool(raw.pop("semantic"))
        try:
            installed = self.configure(CacheConfig(**raw))
        except (TypeError, ValueError) as e:
            from tokenops.config import ConfigError

            raise ConfigError(f"[plugins.semantic_cache]: {e}") from None
        load = getattr(installed.embedder, "load", None)
        if load is not None:  # load the model off the request path
            threading.Thread(target=load, name="semantic-cache-embedder", daemon=True).start()

    @hookimpl
    def tokenops_register_tunables(self, register):
        register_tunables(register)

    @hookimpl
    def tokenops_apply_tunables(self, values):
        mine = {k: v for k, v in values.items() if k.startswith("cache.")}
        if not mine:
            return
        if mine.get("cache.enabled") is False:
            self.disable()
            return
        current = self.cache.config if self.cache is not None else CacheConfig()
        try:
            changes = {_FIELDS[k]: v for k, v in mine.items() if k in _FIELDS}
            if changes.get("threshold") == 0:
                changes["threshold"] = None
            config = dataclasses.replace(current, **changes)
        except (TypeError, ValueError) as e:
            raise TunableError(str(e)) from None
        if self.cache is not None:
            self.cache.set_config(config)
        elif mine.get("cache.enabled"):
            self.configure(config)

    @hookimpl
    def tokenops_tenant_deleted(self, tenant, store):
        """A deleted tenant's cached answers are dropped."""
        return None if self.cache is None else {"semantic_cache_entries": self.cache.delete_tenant(tenant)}

    @hookimpl
    def tokenops_cache_lookup(self, request):
        cache = self.cache
        if cache is None:
            return None
        if not _is_cacheable(request):
            request.decide("semantic_cache", {"result": "off"})
            return None
        response, decision = cache.lookup(request)
        request.decide("semantic_cache", decision)
        if response is None:
            return None
        return dataclasses.replace(response, backend="cache", extra={**response.extra, "cache": decision})

    def embeds_on_store(self) -> bool:
        return self.cache is not None and self.cache.config.is_semantic

    @hookimpl
    @may_block(when=lambda self: self.embeds_on_store())  # a semantic cache embeds the question: stored off the loop
    def tokenops_cache_store(self, request, response):
        cache = self.cache
        if cache is None or not _is_cacheable(request) or response.backend == "cache":
            return
        if response.finish_reason not in ("stop", "length") or not response.text:
            return
        cache.store(request, dataclasses.replace(response, extra=dict(response.extra)))


def is_opted_out(request) -> bool:
    for name, value in (request.headers or {}).items():
        if name.lower() == "x-tokenops-cache" and str(value).strip().lower() in _OFF:
            return True
    flag = request.body.get("cache")
    return flag is False or (isinstance(flag, str) and flag.lower() in _OFF)


def _is_cacheable(request) -> bool:
    return (request.sampling.n or 1) == 1 and not is_opted_out(request)


def register_tunables(register) -> None:
    register(
        Tunable(
            "cache.enabled",
            "bool",
            False,
            "Answer repeated and paraphrased requests from the cache.",
            live=True,
            searchable=False,
        )
    )
    register(
        Tunable(
            "cache.semantic",
            "bool",
            True,
            "Match paraphrases by embedding, not only exact repeats.",
            live=True,
            searchable=False,
        )
    )
    register(
        Tunable(
            "cache.semantic_threshold",
            "float",
            0.0,
            "Cosine similarity a semantic hit needs; 0 = the embedder's calibrated default.",
            live=True,
            minimum=0.0,
            maximum=1.0,
            searchable=False,
        )
    )
    register(
        Tunable(
            "cache.synonym_threshold",
            "float",
            0.65,
            "Cosine two words need to count as synonyms when the verifier aligns prompts; 0 = no synonyms.",
            live=True,
            minimum=0.0,
            maximum=1.0,
            searchable=False,
        )
    )
    register(
        Tunable(
            "cache.ttl_s",
            "float",
            3600.0,
            "Seconds a cached answer lives.",
            live=True,
            minimum=1.0,
            maximum=30 * 86400.0,
            searchable=False,
        )
    )
    register(
        Tunable(
            "cache.max_bytes",
            "int",
            64 * 1024 * 1024,
            "Size budget of the cache (LRU beyond it).",
            live=True,
            minimum=1024,
            maximum=1 << 40,
            log=True,
            searchable=False,
        )
    )
