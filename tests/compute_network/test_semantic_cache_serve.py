"""The semantic cache through a real ``tokenops serve``, driven by the openai SDK: in each
tenant one question, then a look-alike that asks something else (must be answered by
the model, not the cache), then a paraphrase (must be answered from the cache); another
tenant never gets the first tenant's answers. The byte budget (``max_bytes``: the least
recently used answer goes) is driven on the same server, whose budget holds three
answers; the TTL (``ttl_s``) on a second one, since a short TTL is process-wide and
would race the other checks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from tokenops.semcache.cache import ENTRY_OVERHEAD_BYTES
from tokenops.semcache.embedders import MiniLMEmbedder
from tokenops.testing_serve import ServeProcess

REPO = Path(__file__).resolve().parents[2]
MODEL = "ladder-small"
MODEL_PATH = REPO / "tokenops" / "demo_models" / "ladder-small"

CONFIG = f"""
[[models]]
name = "{MODEL}"
path = "{MODEL_PATH}"

[gateway]
api_keys = {{ "key-static" = "static" }}

[plugins.semantic_cache]
enabled = true
"""

#: tenant -> (question, look-alike that must miss, paraphrase that must hit)
PAIRS = {
    "kitchen": ("How do I turn on the lights in the kitchen?", "How do I turn off the lights in the kitchen?",
                "Can you tell me how to turn the lights on in the kitchen?"),
    "money": ("Convert 100 euros to dollars.", "Convert 100 dollars to euros.", "Please convert 100 euros to dollars"),
    "pharmacy": ("Can I take ibuprofen with alcohol?", "Can I take ibuprofen after alcohol?",
                 "can i take ibuprofen with alcohol"),
}


def _ask(client: openai.OpenAI, text: str) -> str:
    out = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0,
                                         messages=[{"role": "user", "content": text}])
    return out.choices[0].message.content or ""


def _decisions(row: dict) -> dict:
    raw = row.get("decisions") or {}
    return json.loads(raw) if isinstance(raw, str) else raw


# -- byte budget and TTL, from [plugins.semantic_cache] max_bytes / ttl_s -------------------------

#: One entry's bytes: question + answer text, the MiniLM vector (384 float32) and the fixed
#: overhead (tokenops/semcache/cache.py); a short question and an 8-token answer stay under 400 B.
_ENTRY_FLOOR = ENTRY_OVERHEAD_BYTES + MiniLMEmbedder.dim * 4
#: Room for three entries, never four.
MAX_BYTES = 3 * (_ENTRY_FLOOR + 400)
TTL_S = 4.0


def _cache_config(**settings: float) -> str:
    head = CONFIG.replace("[plugins.semantic_cache]\nenabled = true\n", "[plugins.semantic_cache]\nenabled = true\n"
                          + "".join(f"{k} = {v}\n" for k, v in settings.items()))
    assert head != CONFIG
    return head


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory):
    """One server for the per-tenant pairs and the byte budget (both orders work: the budget
    holds three answers, and every pair's paraphrase comes right after its question)."""
    if not MiniLMEmbedder.is_available():
        pytest.skip("the semantic extra is not installed")
    with ServeProcess(tmp_path_factory.mktemp("semcache"), config=_cache_config(max_bytes=MAX_BYTES)) as srv, \
            httpx.Client(base_url=srv.url, headers=srv.admin_headers, timeout=60) as admin:
        yield srv, admin


def test_lookalikes_miss_paraphrases_hit_per_tenant_through_serve(budget_server):
    srv, admin = budget_server
    clients = {}
    for tenant in PAIRS:
        assert admin.put(f"/admin/tenants/{tenant}", json={"budget_usd": 5}).status_code == 201
        key = admin.post("/admin/keys", json={"tenant": tenant}).json()["key"]
        clients[tenant] = openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, timeout=120)
    for tenant, (question, lookalike, paraphrase) in PAIRS.items():
        for text in (question, lookalike, paraphrase):
            _ask(clients[tenant], text)
    # another tenant asks the first tenant's exact question: its own miss
    _ask(clients["money"], PAIRS["kitchen"][0])

    rows = admin.get("/admin/requests", params={"limit": 100}).json()["requests"]
    rows = sorted((r for r in rows if r.get("tenant") in PAIRS), key=lambda r: r["ts"])
    decisions = [(r["tenant"], r["cache_hit"], _decisions(r).get("semantic_cache", {})) for r in rows]
    assert len(decisions) == 3 * len(PAIRS) + 1, decisions
    for n, tenant in enumerate(PAIRS):
        (t1, hit1, d1), (t2, hit2, d2), (t3, hit3, d3) = decisions[3 * n: 3 * n + 3]
        assert t1 == t2 == t3 == tenant
        assert not hit1 and d1["result"] == "miss"
        assert not hit2 and d2["result"] == "miss", (tenant, d2)  # the look-alike went to the model
        assert d2.get("rejected"), d2  # ... because the verifier told them apart, not by chance
        assert hit3 and d3 == {**d3, "result": "hit", "match": "semantic"}, (tenant, d3)
    tenant, hit, decision = decisions[-1]
    assert tenant == "money" and not hit and decision["result"] == "miss"


def _cache_header(client: openai.OpenAI, text: str) -> str:
    """``x-tokenops-cache`` of one answer: ``hit; match=exact|semantic`` or ``miss``."""
    raw = client.chat.completions.with_raw_response.create(model=MODEL, max_tokens=8, temperature=0,
                                                           messages=[{"role": "user", "content": text}])
    assert raw.parse().choices[0].message.content is not None
    return raw.headers["x-tokenops-cache"]


def _tenant_client(srv: ServeProcess, admin: httpx.Client, tenant: str) -> openai.OpenAI:
    assert admin.put(f"/admin/tenants/{tenant}", json={}).status_code == 201
    key = admin.post("/admin/keys", json={"tenant": tenant}).json()["key"]
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, timeout=120)


def test_byte_budget_evicts_the_least_recently_used_answer_through_serve(budget_server):
    a, b, c, d = ("What is the capital of France?", "How many legs does a spider have?",
                  "Who wrote the novel Moby Dick?", "What colour is a ripe banana?")
    assert 4 * (_ENTRY_FLOOR + len(max(a, b, c, d, key=len))) > MAX_BYTES  # a fourth entry never fits
    srv, admin = budget_server
    client = _tenant_client(srv, admin, "budget")
    assert [_cache_header(client, q) for q in (a, b, c)] == ["miss"] * 3  # three answers: the budget is full
    assert _cache_header(client, a) == "hit; match=exact"  # a is now the most recently used
    assert _cache_header(client, d) == "miss"  # stored: over budget, the least recently used (b) goes
    assert [_cache_header(client, q) for q in (a, c, d)] == ["hit; match=exact"] * 3
    assert _cache_header(client, b) == "miss"
    # another tenant's answers share the budget but never its entries
    other = _tenant_client(srv, admin, "other")
    assert _cache_header(other, d) == "miss"


@pytest.mark.skipif(not MiniLMEmbedder.is_available(), reason="the semantic extra is not installed")
def test_ttl_expires_an_answer_through_serve(tmp_path):
    question, paraphrase = "How do I reset my router password?", "how do I reset my router password"
    with ServeProcess(tmp_path, config=_cache_config(ttl_s=TTL_S)) as srv, \
            httpx.Client(base_url=srv.url, headers=srv.admin_headers, timeout=60) as admin:
        client = _tenant_client(srv, admin, "ttl")
        assert _cache_header(client, question) == "miss"
        stored = time.monotonic()  # the answer was stored before its response came back
        assert _cache_header(client, question) == "hit; match=exact"
        assert _cache_header(client, paraphrase).startswith("hit")
        time.sleep(max(0.0, stored + TTL_S + 0.5 - time.monotonic()))  # only as long as the TTL needs
        assert _cache_header(client, question) == "miss"  # expired: answered by the model and stored again
        assert _cache_header(client, paraphrase).startswith("hit")  # the cache itself still works
