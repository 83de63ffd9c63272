"""Session memory behind the shared-state seam: the embedded default (one process) and Redis
(``[shared] redis_url``, a real ``redis-server``) give the same answers to one scenario — resent
history stored once, near-duplicates merged, TTL, per-session and total byte budgets, tenants
isolated and deletable — and two Redis-backed memories (two replicas) see each other's turns,
also when they store turns of one session at the same time."""

from __future__ import annotations

import itertools
import threading

import pytest

from tokenops.memory.memory_store import SessionMemory
from tokenops.semcache.embedders import LexicalEmbedder
from tokenops.shared_settings import SharedSettings
from tokenops.shared_state import open_session_memory, redis_client
from tokenops.shared_state.redis_memory import RedisSessionMemory, decode_entries, encode_entries
from tokenops.testing_serve import RedisUnavailable, redis_server

_prefixes = itertools.count()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    try:
        with redis_server(tmp_path_factory.mktemp("redis")) as url:
            yield url
    except RedisUnavailable as e:
        pytest.skip(str(e))


def _pair(url, **kw):
    """(embedded, redis) memories with the same settings; each test its own key prefix."""
    embed = LexicalEmbedder().embed
    embedded = open_session_memory(SharedSettings(), embed, **kw)
    shared = RedisSessionMemory(embed, redis_client(url), prefix=f"t{next(_prefixes)}", **kw)
    assert isinstance(embedded, SessionMemory)
    return embedded, shared


def _strip(entries):
    """Entries without ids (the embedded count and Redis' INCR differ only in where they start)."""
    return None if entries is None else [{k: v for k, v in e.items() if k != "id"} for e in entries]


def test_dedup_merge_and_recall_are_the_same(url):
    for mem in _pair(url):
        turns = [("user", "My locker code is 4417."), ("assistant", "Noted, your locker code is 4417.")]
        assert mem.remember("t", "s", turns) == 2
        assert mem.remember("t", "s", turns) == 0  # a client resending its history
        assert mem.remember("t", "s", [("user", "My locker code is 4417!")]) == 0  # near-duplicate: merged
        entries = mem.entries("t", "s")
        assert len(entries) == 2 and entries[0]["num_seen"] == 3
        assert mem.stats()["merged"] == 1
        top = mem.recall("t", "s", "what is the locker code")
        assert "4417" in top[0][1].text


def test_ttl_and_byte_budgets_forget_the_same_entries(url):
    answers = []
    for mem in _pair(url, ttl_s=100.0, max_session_bytes=6000, max_total_bytes=40_000):
        clock = Clock()
        mem.clock = clock
        out = []
        for i in range(12):
            clock.now += 5
            mem.remember("t", "s", [("user", f"Fact number {i} is about the harbour and the boat {i * 7}.")])
        out.append(_strip(mem.entries("t", "s")))
        clock.now += 101
        out.append(mem.entries("t", "s"))  # all expired
        for i in range(30):  # the total budget: least recently used sessions go whole
            clock.now += 1
            mem.remember("t", f"s{i}", [("user", f"session {i} says " + "word " * 60), ("assistant", f"reply {i} " * 20)])
        sessions = mem.sessions("t")
        out.append([(s["session"], s["entries"], s["bytes"]) for s in sessions])
        assert mem.stats()["bytes"] == sum(s["bytes"] for s in sessions) <= 40_000
        answers.append(out)
    assert answers[0] == answers[1]
    assert answers[0][0] and len(answers[0][0]) < 12 and answers[0][1] is None


def test_tenants_are_isolated_and_deletable_the_same(url):
    answers = []
    for mem in _pair(url):
        mem.remember("a", "s", [("user", "Alpha's secret is 1111.")])
        mem.remember("b", "s", [("user", "Beta's secret is 2222.")])
        mem.remember("a", "s2", [("user", "Another session of alpha.")])
        out = [
            "2222" not in " ".join(e.text for _, e in mem.recall("a", "s", "secret")),
            sorted((s["tenant"], s["session"]) for s in mem.sessions()),
            sorted(s["session"] for s in mem.sessions("a")),
            mem.delete_session("a", "s2"),
            mem.delete_tenant("a"),
            mem.entries("a", "s"),
            [s["tenant"] for s in mem.sessions()],
            mem.stats()["sessions"],
        ]
        answers.append(out)
    assert answers[0] == answers[1]
    assert answers[0][0] and answers[0][3] == 1 and answers[0][4] == 1 and answers[0][6] == ["b"]


def test_names_with_separators_stay_apart(url):
    _, mem = _pair(url)
    mem.remember("a:b", "c", [("user", "first")])
    mem.remember("a", "b:c", [("user", "second")])
    assert [e["text"] for e in mem.entries("a:b", "c")] == ["first"]
    assert [e["text"] for e in mem.entries("a", "b:c")] == ["second"]
    assert mem.delete_tenant("a") == 1 and mem.entries("a:b", "c") is not None


def test_two_replicas_share_sessions_and_concurrent_turns_are_all_kept(url):
    embed = LexicalEmbedder().embed
    prefix = f"t{next(_prefixes)}"
    a, b = (RedisSessionMemory(embed, redis_client(url), prefix=prefix) for _ in range(2))
    a.remember("t", "s", [("user", "My locker code is 4417.")])
    assert a.flush()  # the write lands after remember() returns (write-behind), before the answer does
    assert "4417" in b.recall("t", "s", "locker code")[0][1].text  # made on A, recalled on B

    def turns(mem, side):
        for i in range(15):
            mem.remember("t", "busy", [("user", f"Replica {side} turn {i}: the weather was {side * 3 + i} degrees.")])

    threads = [threading.Thread(target=turns, args=(m, side)) for side, m in ((1, a), (2, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.flush()
    texts = {e["text"] for e in a.entries("t", "busy")}
    assert len(texts) == 30  # no turn lost to the other replica's write
    assert a.stats() == b.stats()


def test_entries_round_trip_through_their_encoding():
    mem = SessionMemory(LexicalEmbedder().embed)
    mem.remember("t", "s", [("user", "Text with a NUL \x00 and ünïcödé."), ("assistant", "Reply.")])
    entries = sorted(mem.recall("t", "s", "text"), key=lambda x: x[1].id)
    back = decode_entries(encode_entries([e for _, e in entries]))
    assert [(e.text, e.role, e.vector.tolist()) for e in back] == [
        (e.text, e.role, e.vector.tolist()) for _, e in entries
    ]


def test_without_redis_a_turn_goes_on_without_memory():
    from tokenops.testing_serve import free_port

    mem = RedisSessionMemory(LexicalEmbedder().embed, redis_client(f"redis://127.0.0.1:{free_port()}/0", 0.5))
    assert mem.remember("t", "s", [("user", "My locker code is 4417.")]) == 0
    assert mem.recall("t", "s", "locker") == [] and mem.num_unavailable == 2


def test_a_replaced_redis_memory_lands_its_writes_and_stops_listening(url):
    """The session-memory plugin swaps memories on reconfiguration and the gateway clears its slot when it
    stops: the one let go is closed, its queued writes in Redis and its listener thread ended."""
    from tokenops.memory.memory_store import get_session_memory, set_session_memory

    embed = LexicalEmbedder().embed
    prefix = f"t{next(_prefixes)}"
    mem = RedisSessionMemory(embed, redis_client(url), prefix=prefix)
    set_session_memory(mem)
    try:
        mem.remember("t", "s", [("user", "The gate code is 8812.")])
    finally:
        set_session_memory(None)
    assert get_session_memory() is None and not mem._copies._thread.is_alive()
    other = RedisSessionMemory(embed, redis_client(url), prefix=prefix)
    assert "8812" in other.recall("t", "s", "gate code")[0][1].text
    other.close()
