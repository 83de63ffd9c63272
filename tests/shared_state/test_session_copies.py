"""A replica's copies of sessions (tokenops/shared_state/session_copies.py) on a real
``redis-server``: a turn of a session this replica served last reads nothing from Redis; another
replica's write (or a session the budgets drop) takes the copy away, so the next turn reads
Redis and recalls what the other replica stored; with the subscription down no copy is used."""

from __future__ import annotations

import itertools
import time

import pytest

from tokenops.semcache.embedders import LexicalEmbedder
from tokenops.shared_state import redis_client
from tokenops.shared_state import write_behind as wb
from tokenops.shared_state.redis_memory import RedisSessionMemory, _member
from tokenops.testing_serve import RedisUnavailable, redis_server

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    try:
        with redis_server(tmp_path_factory.mktemp("redis")) as url:
            yield url
    except RedisUnavailable as e:
        pytest.skip(str(e))


def _replicas(url, n=2, **kw):
    embed = LexicalEmbedder().embed
    prefix = f"c{next(_prefixes)}"
    mems = [RedisSessionMemory(embed, redis_client(url), prefix=prefix, **kw) for _ in range(n)]
    for m in mems:
        assert m._copies.wait_live()
    return mems


def _reads(monkeypatch, behind: list | None = None) -> list[str]:
    """The keys read on a request's path (``WatchedKey`` opened outside the write-behind thread);
    ``behind`` gets what the write-behind thread reads."""
    seen: list[str] = []
    real = wb.WatchedKey.read

    def read(self, *keys):
        import threading

        if threading.current_thread().name != "session-memory-write":
            seen.append(self.key)
        elif behind is not None:
            behind.extend(keys or (self.key,))
        return real(self, *keys)

    monkeypatch.setattr(wb.WatchedKey, "read", read)
    return seen


def _until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_session_this_replica_served_last_is_not_read_again(url, monkeypatch):
    a, _ = _replicas(url)
    behind: list[str] = []
    reads = _reads(monkeypatch, behind)
    a.remember("t", "s", [("user", "My locker code is 4417.")])
    assert len(reads) == 1  # the first turn reads the session
    a.flush()
    a.remember("t", "s", [("user", "And my bike is blue.")])
    a.remember("t", "s", [("assistant", "Noted: locker 4417, blue bike.")])
    assert len(reads) == 1  # later turns merge into the copy; the writes go behind
    a.flush()
    assert behind and all(":mem:v:" in k for k in behind)  # ... and check the version only, not the value
    texts = [e.text for _, e in a.recall("t", "s", "locker code")]
    assert "My locker code is 4417." in texts and "And my bike is blue." in texts
    assert [e["text"] for e in a.entries("t", "s")] == [
        "My locker code is 4417.", "And my bike is blue.", "Noted: locker 4417, blue bike."]


def test_another_replicas_write_takes_the_copy_away(url):
    a, b = _replicas(url)
    a.remember("t", "s", [("user", "My locker code is 4417.")])
    a.flush()
    assert a._copies.get(_member("t", "s")) is not None
    b.remember("t", "s", [("user", "The parcel goes to gate 12.")])
    b.flush()
    _until(lambda: a._copies.get(_member("t", "s")) is None)  # B's message arrived on A
    texts = [e.text for _, e in a.recall("t", "s", "parcel gate")]
    assert texts[0] == "The parcel goes to gate 12." and "My locker code is 4417." in texts
    a.remember("t", "s", [("user", "Third turn, on A again.")])
    a.flush()
    assert len(b.entries("t", "s")) == 3  # nothing lost either way


def test_a_session_the_budgets_drop_is_dropped_from_every_copy(url):
    a, b = _replicas(url, max_sessions=2)
    a.remember("t", "old", [("user", "The oldest session.")])
    a.flush()
    assert a._copies.get(_member("t", "old")) is not None
    b.remember("t", "mid", [("user", "A middle session.")])
    b.remember("t", "new", [("user", "The newest session.")])  # over max_sessions: "old" goes
    b.flush()
    _until(lambda: a._copies.get(_member("t", "old")) is None)
    assert a.recall("t", "old", "oldest") == []


def test_no_copy_is_used_while_the_subscription_is_down(url, monkeypatch):
    (a,) = _replicas(url, n=1)
    a.remember("t", "s", [("user", "My locker code is 4417.")])
    a.flush()
    assert a._copies.get(_member("t", "s")) is not None
    a._copies.close()  # as when Redis stops answering the subscriber
    assert a._copies.get(_member("t", "s")) is None
    reads = _reads(monkeypatch)
    a.remember("t", "s", [("user", "Second turn.")])
    assert len(reads) == 1  # read from Redis again
    a.flush()
    assert len(a.entries("t", "s")) == 2


def test_a_dropped_memory_stops_its_threads(url):
    """A reconfigured gateway replaces its memory: the old one's listener and writer go with it."""
    import gc

    (a,) = _replicas(url, n=1)
    a.remember("t", "s", [("user", "Something to write.")])
    a.flush()
    threads = [a._copies._thread, a._writes._thread]
    assert all(t.is_alive() for t in threads)
    del a
    gc.collect()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
