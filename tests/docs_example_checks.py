"""Checks that the engine, memory, capture and keys blocks of docs/configuration.md *act*
through a real ``tokenops serve`` (used by tests/test_docs_examples.py).

Each check drives the server with the openai SDK and reads what only that block can
cause: int8 weights and a used offload tier in the engine stats, a conversation fitted
with recalled turns, an EPLB plan of the block's shape, captured pairs of the block's
model only, managed keys living in the block's Redis and enforced. A block that stops
acting (its section ignored, its plugin unloaded) fails its check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

DOCS_REDIS_URL = "redis://127.0.0.1:6379/0"


def first_toml_block(doc: Any, heading: str) -> str:
    """The first ```toml block after ``heading`` in the markdown file ``doc`` (a Path)."""
    text = doc.read_text()
    section = text[text.index(heading) :]
    block = section[section.index("```toml") + len("```toml") :]
    return block[: block.index("```")]


def stats(srv: Any) -> dict:
    return httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers, timeout=30).json()


def rows(srv: Any) -> list[dict]:
    return httpx.get(f"{srv.url}/admin/requests?limit=50", headers=srv.admin_headers, timeout=30).json()["requests"]


def _engine(srv: Any, model: str) -> dict:
    return stats(srv)["engines"][f"{model}#0"]


def _ask(client: openai.OpenAI, model: str, text: str, **kw: Any) -> Any:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                          max_tokens=kw.pop("max_tokens", 4), temperature=0, **kw)


def check_quantization(srv: Any, client: openai.OpenAI) -> None:
    for model in ("tokenops-demo", "tokenops-ladder-small"):
        assert _ask(client, model, "hello").choices[0].message.content is not None
        assert _engine(srv, model)["weight_encoding"].startswith("int8"), _engine(srv, model)


def check_compile(srv: Any, client: openai.OpenAI) -> None:
    assert _ask(client, "tokenops-demo", "hello").choices[0].message.content is not None  # compiles first
    assert _engine(srv, "tokenops-demo")["compiled"] is True


def _long_prompt(k: int, phrases: int = 180) -> str:
    return " ".join(f"topic{k} item{i} boats gulls" for i in range(phrases))  # ~1,700 tokens, below 2,048


def check_kv_offload(srv: Any, client: openai.OpenAI) -> None:
    """Distinct long prompts until the KV pool recycles the first one's blocks into the host
    tier; the first prompt again is then served from that tier."""
    model = "tokenops-demo"
    first = client.completions.create(model=model, prompt=_long_prompt(0), max_tokens=1, temperature=0)
    for k in range(1, 64):
        if _engine(srv, model)["kv_offload"]["saved_blocks"] > 0:
            break
        client.completions.create(model=model, prompt=_long_prompt(k), max_tokens=1)
    tier = _engine(srv, model)["kv_offload"]
    assert tier["saved_blocks"] > 0 and tier["loaded_blocks"] == 0, tier
    back = client.completions.create(model=model, prompt=_long_prompt(0), max_tokens=1, temperature=0)
    tier = _engine(srv, model)["kv_offload"]
    assert tier["loaded_blocks"] > 0 and tier["hit_tokens"] > 0, tier
    assert back.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens // 2, back.usage


def _conversation(fact: str, turns: int) -> list[dict]:
    msgs = [{"role": "user", "content": f"Please remember: {fact}"},
            {"role": "assistant", "content": "I will remember that."}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"Describe the harbour on day {i}: the boats, the gulls and the tide."},
                 {"role": "assistant", "content": f"On day {i} the tide was low, six boats were moored and gulls circled."}]
    return msgs + [{"role": "user", "content": "What is my locker code?"}]


def check_session_memory(srv: Any, client: openai.OpenAI) -> None:
    """A conversation longer than the model's context: 400 without a session; with one, the
    oldest turns are dropped and the stored fact is recalled into the prompt."""
    msgs = _conversation("my locker code is 4417.", turns=70)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tokenops-demo", messages=msgs, max_tokens=4)
    assert err.value.code == "context_length_exceeded"
    out = client.chat.completions.create(model="tokenops-demo", messages=msgs, max_tokens=4, temperature=0,
                                         extra_headers={"x-session-id": "docs-s1"})
    assert out.usage.prompt_tokens <= 2048 - 4, out.usage
    memory = rows(srv)[0]["decisions"]["memory"]
    assert memory["fitted"] and memory["dropped_turns"] > 0 and memory["injected"] > 0, memory
    admin = httpx.Client(base_url=srv.url, headers=srv.admin_headers, timeout=30)
    entries = admin.get("/admin/memory/sessions/default/docs-s1").json()["entries"]
    assert any("4417" in e["text"] for e in entries), entries


def check_eplb(srv: Any, client: openai.OpenAI) -> None:
    """The plan is computed from the MoE's expert load with the block's devices/redundancy
    (2 and 2; the defaults are 4 and 4)."""
    _ask(client, "tokenops-demo-moe", "hello there, how are the experts loaded?", max_tokens=8)
    plan = _engine(srv, "tokenops-demo-moe").get("eplb")
    assert plan is not None and (plan["devices"], plan["redundant"]) == (2, 2), plan
    assert plan["replicated"] != "none", plan  # the 2 redundant slots went to the hottest experts
    assert plan["max_imbalance_after"] <= plan["max_imbalance_before"], plan


def _pairs(srv: Any) -> dict[tuple[str, str], int]:
    r = httpx.get(f"{srv.url}/admin/distill/pairs", headers=srv.admin_headers, timeout=30)
    assert r.status_code == 200, r.text
    return {(p["tenant"], p["model"]): p["count"] for p in r.json()["pairs"]}


def check_distill_capture(srv: Any, client: openai.OpenAI) -> None:
    """The block's model is captured for the block's tenant; another model is not."""
    import time

    _ask(client, "tokenops-ladder-small", "What is 2 + 2?")
    _ask(client, "tokenops-ladder-large", "What is 2 + 2?")
    deadline = time.monotonic() + 30  # the store writer batches rows
    while not _pairs(srv) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _pairs(srv) == {("default", "tokenops-ladder-large"): 1}


class Unavailable(Exception):
    """What a block needs is missing here: its check is skipped, the group's others still run."""


@contextlib.contextmanager
def block_redis(config: str, workdir: Any) -> Iterator[str]:
    """The config with the block's Redis URL pointed at a throwaway ``redis-server``."""
    from tokenops.testing_serve import RedisUnavailable, redis_server

    assert DOCS_REDIS_URL in config
    try:
        with redis_server(workdir) as url:
            yield config.replace(DOCS_REDIS_URL, url)
    except RedisUnavailable as e:  # raised before the yield: the caller serves without the block
        raise Unavailable(str(e)) from None


def check_keys(srv: Any, client: openai.OpenAI) -> None:
    """A key created through the admin API lands in the block's Redis and is enforced."""
    import tomllib

    import redis

    served = tomllib.loads((srv.workdir / "tokenops.toml").read_text())["plugins"]["keys"]["redis_url"]
    admin = httpx.Client(base_url=srv.url, headers=srv.admin_headers, timeout=30)
    assert admin.put("/admin/tenants/ops", json={}).status_code == 201
    key = admin.post("/admin/keys", json={"tenant": "ops", "models": ["tokenops-demo"]}).json()
    shared = redis.Redis.from_url(served)
    assert any(shared.type(name) == b"hash" and shared.hexists(name, key["id"]) for name in shared.scan_iter())
    owner = openai.OpenAI(base_url=srv.base_url, api_key=key["key"], max_retries=0)
    assert _ask(owner, "tokenops-demo", "hi").choices[0].message.content is not None
    with pytest.raises(openai.PermissionDeniedError):
        _ask(owner, "tokenops-ladder-small", "hi")
    with pytest.raises(openai.AuthenticationError):  # a managed key exists: everyone needs one
        _ask(client, "tokenops-demo", "hi")
