"""Session memory and the KV offload tier through a real ``tokenops serve`` (openai SDK).

The demo model's context is cut to 512 tokens so a short conversation outgrows it."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tokenops.testing_serve import ServeProcess

CONFIG = """
[engine]
kv_cache_tokens = 512
[gateway]
api_keys = { "key-a" = "tenant-a", "key-b" = "tenant-b" }
[plugins.session_memory]
enabled = true
embedder = "{embedder}"
"""


def conversation(fact: str, num_turns: int = 14) -> list[dict]:
    msgs = [{"role": "user", "content": f"Please remember: {fact}"},
            {"role": "assistant", "content": "I will remember that."}]
    for i in range(num_turns):
        msgs += [{"role": "user", "content": f"Describe the harbour on day {i}: the boats, the gulls and the tide."},
                 {"role": "assistant", "content": f"On day {i} the tide was low, six boats were moored and gulls circled."}]
    return msgs + [{"role": "user", "content": "What is my locker code?"}]


def _run(tmp_path, embedder):
    with ServeProcess(tmp_path, config=CONFIG.replace("{embedder}", embedder)) as srv:
        a = openai.OpenAI(base_url=srv.base_url, api_key="key-a", max_retries=0)
        b = openai.OpenAI(base_url=srv.base_url, api_key="key-b", max_retries=0)
        model = a.models.list().data[0].id
        msgs = conversation("my locker code is 4417.")
        # without a session the conversation does not fit: the usual 400
        with pytest.raises(openai.BadRequestError) as err:
            a.chat.completions.create(model=model, messages=msgs, max_tokens=8)
        assert err.value.code == "context_length_exceeded"
        # with a session it is fitted: old turns dropped, the stored fact injected
        out = a.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0,
                                        extra_headers={"x-session-id": "s1"})
        assert out.choices[0].finish_reason in ("stop", "length") and 0 < out.usage.prompt_tokens <= 512 - 8
        stream = a.chat.completions.create(model=model, messages=msgs, max_tokens=4, stream=True,
                                           extra_headers={"x-session-id": "s1"})
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) is not None
        b.chat.completions.create(model=model, messages=conversation("my locker code is 9902.", 2), max_tokens=4,
                                  extra_headers={"x-session-id": "s1"})
        admin = httpx.Client(base_url=srv.url, headers=srv.admin_headers)
        sessions = admin.get("/admin/memory/sessions").json()["sessions"]
        assert {(s["tenant"], s["session"]) for s in sessions} == {("tenant-a", "s1"), ("tenant-b", "s1")}
        texts_a = " ".join(e["text"] for e in admin.get("/admin/memory/sessions/tenant-a/s1").json()["entries"])
        texts_b = " ".join(e["text"] for e in admin.get("/admin/memory/sessions/tenant-b/s1").json()["entries"])
        assert "4417" in texts_a and "9902" not in texts_a and "9902" in texts_b and "4417" not in texts_b
        # each turn stored once although the history was sent three times
        assert len(re.findall("4417", texts_a)) == 1
        assert admin.get("/admin/memory/sessions", headers={"X-Admin-Key": "wrong"}).status_code == 401
        assert admin.delete("/admin/memory/sessions/tenant-a/s1").json()["deleted_entries"] > 0
        assert admin.get("/admin/memory/sessions/tenant-a/s1").status_code == 404
        assert admin.delete("/admin/memory/tenants/tenant-b").json()["deleted_entries"] > 0
        assert admin.get("/admin/memory/sessions").json()["sessions"] == []


def test_long_conversation_fits_with_session_memory(tmp_path):
    _run(tmp_path, "lexical")


@pytest.mark.slow
def test_long_conversation_fits_with_session_memory_minilm(tmp_path):
    _run(tmp_path, "minilm")
