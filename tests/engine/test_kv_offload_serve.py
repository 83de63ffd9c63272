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
