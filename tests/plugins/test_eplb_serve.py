"""A real ``tokenops serve`` on the demo MoE, driven by the openai SDK: the EPLB plan in
/admin/stats is computed when the expert load changes, not on every poll or scrape."""

import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from tokenops.testing_serve import ServeProcess

MOE = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "moe"
CONFIG = f"""[[models]]
name = "moe"
path = "{MOE}"

[engine]
kv_cache_tokens = 1024
torch_threads = 1

[plugins.eplb]
devices = 2
redundant = 2
plan_interval_s = 0
"""


def _plan(srv: ServeProcess) -> dict | None:
    stats = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers, timeout=10).json()
    return stats["engines"]["moe#0"].get("eplb")


def test_polls_and_scrapes_reuse_the_plan_until_traffic_moves_the_load(tmp_path):
    with ServeProcess(tmp_path, config=CONFIG, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        assert _plan(srv) is None  # no load yet: no plan
        client.chat.completions.create(model="moe", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
        first = _plan(srv)
        assert first is not None and (first["devices"], first["redundant"]) == (2, 2)
        for _ in range(3):
            assert httpx.get(f"{srv.url}/metrics", timeout=10).status_code == 200
            assert _plan(srv) == first  # same load: the cached plan, same computed_at
        time.sleep(0.05)
        client.chat.completions.create(model="moe", messages=[{"role": "user", "content": "more words here"}],
                                       max_tokens=4)
        second = _plan(srv)
        assert second["computed_at"] > first["computed_at"]  # the load moved: a new plan


def test_unknown_eplb_key_is_one_line(tmp_path):
    (tmp_path / "tokenops.toml").write_text("[plugins.eplb]\ndevice = 2\n")
    r = subprocess.run([sys.executable, "-m", "tokenops", "serve", "--no-store", "--port", "1"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: tokenops.toml: [plugins.eplb] has unknown key 'device'; did you mean devices?"]
