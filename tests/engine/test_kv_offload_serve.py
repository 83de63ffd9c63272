"""KV offload tier through a real ``tokenops serve``: a returning prompt whose prefix the
small KV pool evicted is served from the tier (cached tokens in usage, /metrics counter)."""

from __future__ import annotations

import httpx
import openai

from tokenops.testing_serve import ServeProcess

CONFIG = """
[engine]
kv_cache_tokens = 512
[plugins.kv_offload]
enabled = true
host_mb = 16
"""


def _hits(url: str) -> float:
    lines = [line for line in httpx.get(url + "/metrics").text.splitlines()
             if line.startswith("tokenops:kv_offload_hits_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_returning_prefix_after_eviction_hits_the_offload_tier(tmp_path):
    with ServeProcess(tmp_path, config=CONFIG, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        session = " ".join(f"harbour{i} boats gulls tide" for i in range(30))
        other = " ".join(f"mountain{i} snow pines wind" for i in range(55))
        first = client.completions.create(model=model, prompt=session, max_tokens=2, temperature=0)
        client.completions.create(model=model, prompt=other, max_tokens=2)  # evicts the session's blocks
        assert _hits(srv.url) == 0
        back = client.completions.create(model=model, prompt=session, max_tokens=2, temperature=0)
        cached = back.usage.prompt_tokens_details.cached_tokens
        assert cached >= back.usage.prompt_tokens // 2, back.usage
        assert _hits(srv.url) > 0
        assert back.choices[0].text == first.choices[0].text  # greedy: the same answer from loaded K/V
        stats = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json()
        assert "loaded_blocks" in str(stats)


def _offload_stats(srv: ServeProcess) -> dict:
    stats = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json()
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "disk_loaded_blocks" in node:
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(stats)
    assert found, stats
    return found[0]


def test_disk_tier_behind_a_tiny_host_tier_serves_a_returning_prefix(tmp_path):
    disk = tmp_path / "kv-disk"
    config = f"""
[engine]
kv_cache_tokens = 512
[plugins.kv_offload]
enabled = true
host_blocks = 2
disk_mb = 64
disk_path = "{disk}"
"""
    with ServeProcess(tmp_path, config=config, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        session = " ".join(f"harbour{i} boats gulls tide" for i in range(30))
        first = client.completions.create(model=model, prompt=session, max_tokens=2, temperature=0)
        for k in range(2):  # other prompts push the session's blocks out of the pool, then out of the host tier
            client.completions.create(model=model, prompt=" ".join(f"mountain{k}{i} snow pines wind" for i in range(55)),
                                      max_tokens=2)
        before = _offload_stats(srv)
        assert before["spilled_blocks"] > 0 and before["disk_blocks"] > 0, before
        assert any(disk.iterdir())  # the disk tier holds block files
        back = client.completions.create(model=model, prompt=session, max_tokens=2, temperature=0)
        after = _offload_stats(srv)
        assert after["disk_loaded_blocks"] > before["disk_loaded_blocks"], after
        assert back.usage.prompt_tokens_details.cached_tokens > 0, back.usage
        assert back.choices[0].text == first.choices[0].text  # greedy: the same answer from K/V read off disk
