"""Does closing an engine give its memory back? ``[gateway] max_loaded_models`` through a real
``tokenops serve`` on the embedded SmolLM2 Q4_1 GGUF served under two names (``a``, ``b``), one
resident at a time: the server's resident set (``VmRSS``) and thread count after each request as the
requests alternate (every one a swap), against the same two models both resident (no bound).

A leak shows as a resident set that climbs by about one engine per swap; a released engine leaves it
flat at about one engine's worth below the both-resident server. Also: ``/health`` latency polled
every 10 ms during the swaps (the build runs on its own thread, not the event loop). Prints JSON.

    .venv/bin/python tests/benchmarks/model_swap_memory.py [--swaps 8] [--kv-tokens 8192]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lora_serve import HealthPoller, status_mib  # noqa: E402
from tests.real_model import SERVE_ENV, gguf_path  # noqa: E402
from tokenops.testing_serve import ServeProcess  # noqa: E402

WORK = Path("/tmp/tokenops-model-swap-memory")


def config(bound: int, kv_tokens: int) -> str:
    engine = f"engine = {{ kv_cache_tokens = {kv_tokens} }}\n"
    models = "".join(f'\n[[models]]\nname = "{n}"\npath = "{gguf_path()}"\n{engine}' for n in "ab")
    return f"[gateway]\nmax_loaded_models = {bound}\n{models}"


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def run(bound: int, swaps: int, kv_tokens: int) -> dict:
    import httpx
    import openai

    with ServeProcess(WORK / f"bound-{bound}", config=config(bound, kv_tokens), env=SERVE_ENV, store=False) as srv:
        pid = srv.proc.pid
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        series = [{"after": "ready", "rss_mib": status_mib(pid, "VmRSS"), "threads": threads(pid)}]
        with HealthPoller(srv.url) as poller:
            start = time.perf_counter()
            for i in range(swaps):
                model = "ab"[i % 2]
                client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=0)
                series.append({"after": model, "rss_mib": status_mib(pid, "VmRSS"), "threads": threads(pid)})
            health = poller.stats(start, time.perf_counter())
        stats = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers).json().get("model_swap") or {}
        return {
            "max_loaded_models": bound,
            "series": series,
            "peak_rss_mib": status_mib(pid, "VmHWM"),
            "health_during_swaps": health,
            "num_loads": stats.get("num_loads"),
            "num_evictions": stats.get("num_evictions"),
            "load_seconds": stats.get("load_seconds"),
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--swaps", type=int, default=8)
    ap.add_argument("--kv-tokens", type=int, default=8192)
    opts = ap.parse_args()
    bounded = run(1, opts.swaps, opts.kv_tokens)
    both = run(0, opts.swaps, opts.kv_tokens)
    rss = [s["rss_mib"] for s in bounded["series"][2:]]  # after the first swap
    out = {
        "bounded": bounded,
        "both_resident": both,
        "rss_growth_over_swaps_mib": round(rss[-1] - rss[0], 1) if rss else None,
        "one_engine_mib": round(both["series"][-1]["rss_mib"] - bounded["series"][-1]["rss_mib"], 1),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
