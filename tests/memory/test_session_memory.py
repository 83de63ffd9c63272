"""Session memory parts: the store (dedup, merge, TTL, byte budget, tenants) and the
fitting of a conversation into a token budget (lexical embedder, a word-count tokenizer)."""

from __future__ import annotations

import pytest

from tokenops.memory.fit import MEMORY_HEADER, fit_conversation, message_text
from tokenops.memory.memory_store import SessionMemory, split_chunks
from tokenops.semcache.embedders import LexicalEmbedder


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def memory(**kw):
    return SessionMemory(LexicalEmbedder().embed, **kw)


def words(messages):
    return sum(len(message_text(m).split()) + 2 for m in messages)


def test_resent_history_is_stored_once_and_near_duplicates_merge():
    mem = memory()
    turns = [("user", "My locker code is 4417."), ("assistant", "Noted, your locker code is 4417.")]
    assert mem.remember("t", "s", turns) == 2
    assert mem.remember("t", "s", turns) == 0  # a client resending its history
    assert mem.remember("t", "s", [("user", "My locker code is 4417!")]) == 0  # near-duplicate: merged
    entries = mem.entries("t", "s")
    assert len(entries) == 2 and entries[0]["num_seen"] == 3
    assert mem.stats()["merged"] == 1


def test_ttl_and_byte_budget_forget_the_least_recently_seen():
    clock = Clock()
    mem = memory(ttl_s=60, clock=clock, max_session_bytes=3 * (4096 + 60))
    for i in range(5):
        clock.now += 1
        mem.remember("t", "s", [("user", f"fact number {i} is about topic {i * 7} and more")])
    texts = [e["text"] for e in mem.entries("t", "s")]
    assert len(texts) == 3 and texts[0].startswith("fact number 2")  # oldest two evicted
    clock.now += 61
    assert mem.entries("t", "s") is None and mem.sessions() == []


def test_tenants_and_sessions_are_isolated_and_deletable():
    mem = memory()
    mem.remember("a", "s1", [("user", "alpha secret is blue")])
    mem.remember("b", "s1", [("user", "beta secret is green")])
    mem.remember("a", "s2", [("user", "another session")])
    assert [e.text for _, e in mem.recall("b", "s1", "what is the secret")] == ["beta secret is green"]
    assert {(s["tenant"], s["session"]) for s in mem.sessions()} == {("a", "s1"), ("b", "s1"), ("a", "s2")}
    assert [s["session"] for s in mem.sessions("b")] == ["s1"]
    assert mem.delete_session("a", "s1") == 1 and mem.entries("a", "s1") is None
    assert mem.delete_tenant("a") == 1 and mem.sessions() == [{**mem.sessions()[0]}] and mem.sessions()[0]["tenant"] == "b"


def test_split_chunks_at_sentences_within_the_limit():
    text = "First fact here. Second fact is longer than that! " + "x" * 50 + "\nLast line"
    pieces = split_chunks(text, 30)
    assert all(len(p) <= 30 for p in pieces) and pieces[0] == "First fact here."
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "").replace("\n", "")


def _conversation(num_turns):
    msgs = [{"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Remember this: my locker code is 4417."},
            {"role": "assistant", "content": "Sure, I will remember it."}]
    for i in range(num_turns):
        msgs += [{"role": "user", "content": f"Tell me about the weather on day {i} in some detail please."},
                 {"role": "assistant", "content": f"Day {i} was sunny with a light breeze and mild temperature."}]
    return msgs + [{"role": "user", "content": "What is my locker code?"}]


def test_fit_drops_old_turns_and_injects_the_relevant_entry():
    msgs = _conversation(30)
    mem = memory()
    mem.remember("t", "s", [(m["role"], m["content"]) for m in msgs if m["role"] != "system"])
    recalled = [(e.role, e.text) for _, e in mem.recall("t", "s", msgs[-1]["content"])]
    assert any("locker code is 4417" in text for _, text in recalled[:2])  # (the question itself is stored too)
    assert words(msgs) > 200
    fitted, info = fit_conversation(msgs, 200, words, recalled)
    assert words(fitted) <= 200
    assert fitted[0] == msgs[0] and fitted[-1] == msgs[-1]
    assert fitted[1]["role"] == "system" and fitted[1]["content"].startswith(MEMORY_HEADER)
    assert "4417" in fitted[1]["content"]
    assert fitted[2]["role"] == "user" and info["dropped_turns"] > 0 and info["injected"] >= 1
    # plain truncation keeps the newest turns only: the fact is gone
    assert not any("4417" in message_text(m) for m in fitted[2:])


def test_fit_gives_up_when_the_last_message_alone_is_too_long():
    msgs = [{"role": "user", "content": "word " * 100}]
    assert fit_conversation(msgs, 50, words, []) is None


def test_plugin_settings_are_checked():
    from tokenops.memory.memory_store import get_session_memory, set_session_memory
    from tokenops_plugins.model_optimization.session_memory import SessionMemoryPlugin

    from tokenops.config import Settings as RealSettings

    def Settings(conf):  # the real settings with only [plugins.session_memory]
        return RealSettings(plugins={"session_memory": conf})

    plugin = SessionMemoryPlugin()  # an instance of its own: its config is its own
    try:
        plugin.tokenops_configure(Settings({}))
        assert get_session_memory() is None  # off by default
        plugin.tokenops_configure(Settings({"enabled": True, "embedder": "lexical", "ttl_s": 5}))
        assert get_session_memory().ttl_s == 5 and plugin.conf["ttl_s"] == 5
        for bad in ({"ttl_s": -1}, {"embedder": "bert"}, {"max_session_kb": 0}, {"nope": 1}):
            with pytest.raises(ValueError, match="session_memory"):
                plugin.tokenops_configure(Settings({"enabled": True, **bad}))
    finally:
        set_session_memory(None)


def test_total_byte_budget_drops_least_recently_used_sessions():
    clock = Clock()
    mem = memory(max_total_bytes=40_000, clock=clock)
    for i in range(30):  # each session a few entries of text plus vectors
        clock.now += 1
        mem.remember("t", f"s{i}", [("user", f"session {i} says " + "word " * 60), ("assistant", f"reply {i} " * 20)])
        assert mem.num_bytes <= 40_000
    kept = {s["session"] for s in mem.sessions("t")}
    assert "s29" in kept and "s0" not in kept and mem.stats()["bytes"] == sum(s["bytes"] for s in mem.sessions("t"))
    mem.delete_tenant("t")
    assert mem.num_bytes == 0 and mem.stats()["sessions"] == 0
