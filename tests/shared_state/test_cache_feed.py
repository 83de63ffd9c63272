"""The semantic cache across replicas (``[shared] redis_url``): two caches, each with its own
index, fed through one Redis stream (a real ``redis-server``). An answer stored on A hits on B
without B embedding anything, a replica that starts late reads what was stored before it, a
tenant dropped on one is dropped on the other, and each keeps its own byte budget."""

from __future__ import annotations

import itertools
import time

import pytest

from tokenops.semcache.cache import CacheConfig, SemanticCache
from tokenops.semcache.embedders import LexicalEmbedder
from tokenops.shared_settings import SharedSettings
from tokenops.shared_state import open_cache_feed, redis_client
from tokenops.shared_state.redis_cache_feed import RedisCacheFeed
from tokenops.testing_serve import RedisUnavailable, redis_server
from tokenops.types import GatewayRequest, GatewayResponse

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    try:
        with redis_server(tmp_path_factory.mktemp("redis")) as url:
            yield url
    except RedisUnavailable as e:
        pytest.skip(str(e))


class CountingEmbedder(LexicalEmbedder):
    def __init__(self):
        super().__init__()
        self.num_calls = 0

    def embed(self, texts):
        self.num_calls += 1
        return super().embed(texts)


def chat(text: str, tenant: str = "t") -> GatewayRequest:
    messages = [{"role": "user", "content": text}]
    return GatewayRequest(kind="chat", model="m", body={"messages": messages}, messages=messages, tenant=tenant,
                          max_tokens=16)


def _wait(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the feed did not deliver in time"
        time.sleep(0.01)


def _replica(url: str, prefix: str, config: CacheConfig | None = None) -> tuple[SemanticCache, RedisCacheFeed]:
    cache = SemanticCache(CountingEmbedder(), config)
    feed = RedisCacheFeed(cache, redis_client(url, 5.0), prefix=prefix)
    return cache, feed


def test_an_answer_stored_on_one_replica_hits_on_the_other(url):
    prefix = f"feed{next(_prefixes)}"
    (a, feed_a), (b, feed_b) = _replica(url, prefix), _replica(url, prefix)
    try:
        a.store(chat("How do I reset my password?"), GatewayResponse(text="Click 'forgot password'.", model="m"))
        _wait(lambda: len(b) == 1)
        calls = b.embedder.num_calls
        exact, decision = b.lookup(chat("How do I reset my password?"))
        assert exact.text == "Click 'forgot password'." and decision["match"] == "exact"
        paraphrase, decision = b.lookup(chat("How can I reset my password?"))
        assert paraphrase is not None and decision["match"] == "semantic"
        assert b.embedder.num_calls == calls + 1  # only B's own question: the entry's vector came with it
        other, _ = b.lookup(chat("How do I reset my password?", tenant="someone-else"))
        assert other is None  # still per tenant
        # a replica that starts late reads what was stored before it
        c, feed_c = _replica(url, prefix)
        assert feed_c.wait_caught_up() and len(c) == 1
        # a tenant dropped on B is dropped everywhere
        assert b.delete_tenant("t") == 1
        _wait(lambda: len(a) == 0 and len(c) == 0)
        feed_c.close()
    finally:
        feed_a.close()
        feed_b.close()


def test_each_replica_keeps_its_byte_budget(url):
    prefix = f"feed{next(_prefixes)}"
    (a, feed_a), (b, feed_b) = _replica(url, prefix), _replica(url, prefix, CacheConfig(max_bytes=8000))
    try:
        for i in range(20):
            a.store(chat(f"Question number {i} about boats?"), GatewayResponse(text="x" * 200, model="m"))
        _wait(lambda: feed_b.num_received == 20)
        assert len(a) == 20 and 0 < len(b) < 20 and b.num_bytes <= 8000
    finally:
        feed_a.close()
        feed_b.close()


def test_without_redis_url_there_is_no_feed():
    assert open_cache_feed(SharedSettings(), SemanticCache(LexicalEmbedder())) is None
