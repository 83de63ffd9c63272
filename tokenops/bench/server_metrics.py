"""Counters a bench level reads from the server's Prometheus ``/metrics`` before and
after it runs: the prefix-cache hit rate of the level's own requests.

tokenops exposes vLLM's series under ``tokenops:``; vLLM itself under ``vllm:``.
A server without ``/metrics`` or without these counters yields None (the column
shows "-"), never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

_SERIES = re.compile(r"^(?:tokenops|vllm):prefix_cache_(queries|hits)_total(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_MODEL = re.compile(r'model_name="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class PrefixCounters:
    queries: float
    hits: float


def metrics_url(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1") + "/metrics"


def parse_prefix_counters(text: str, model: str | None = None) -> PrefixCounters | None:
    """Sum the prefix-cache counters (of ``model`` when the series name models)."""
    sums = {"queries": 0.0, "hits": 0.0}
    found = False
    for line in text.splitlines():
        m = _SERIES.match(line)
        if not m:
            continue
        name = _MODEL.search(m.group("labels") or "")
        if model is not None and name is not None and name.group(1) != model:
            continue
        try:
            sums[m.group(1)] += float(m.group("value"))
        except ValueError:
            continue
        found = True
    return PrefixCounters(sums["queries"], sums["hits"]) if found else None


async def scrape_prefix(client: httpx.AsyncClient, url: str, model: str | None) -> PrefixCounters | None:
    try:
        r = await client.get(metrics_url(url), timeout=10.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return parse_prefix_counters(r.text, model)


def hit_rate(before: PrefixCounters | None, after: PrefixCounters | None) -> float | None:
    """Hits per queried prompt token between two scrapes (None when unknown or nothing queried)."""
    if before is None or after is None:
        return None
    queries, hits = after.queries - before.queries, after.hits - before.hits
    if queries <= 0 or hits < 0:  # nothing queried, or the server restarted in between
        return None
    return hits / queries
