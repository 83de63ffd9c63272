"""The example engine plugin (examples/tokenops-history-proposer), pip-installed from its own
folder: its proposer and queue order are selected by name through a real ``tokenops serve``,
its proposals are accepted, and greedy output equals a model without speculation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tokenops.testing_serve import ServeProcess

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tokenops-history-proposer"

CONFIG = """
[engine]
schedule_policy = "sjf"

[[models]]
name = "tokenops-demo"
backend = "local"
engine = { speculative = "history", num_speculative_tokens = 4 }

[[models]]
name = "plain"
backend = "local"

[plugins.history_proposer]
min_match = 2
"""


@pytest.fixture(scope="module")
def site(install_example):
    return install_example(EXAMPLE.name)


def test_listed_with_its_engine_hooks(site):
    env = {**os.environ, "PYTHONPATH": site}
    env.pop("TOKENOPS_LOAD_PLUGINS", None)
    out = subprocess.run([sys.executable, "-m", "tokenops", "plugins", "--json"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    entry = next(p for p in json.loads(out.stdout)["layers"]["model_optimization"] if p["name"] == "history_proposer")
    assert entry["source"] == "entry-point"
    assert {"tokenops_register_proposers", "tokenops_register_schedule_orders"} <= set(entry["hooks"])


def test_selected_by_name_through_serve_accepts_and_keeps_greedy_output(site, tmp_path):
    with ServeProcess(tmp_path, config=CONFIG, env={"PYTHONPATH": site}) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")

        def ask(model):
            r = client.chat.completions.create(model=model, max_tokens=24, temperature=0,
                                               messages=[{"role": "user", "content": "Tell me about the sea."}])
            return r.choices[0].message.content

        first, again, plain = ask("tokenops-demo"), ask("tokenops-demo"), ask("plain")
        stats = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers, timeout=10).json()["engines"]
        tunables = httpx.get(f"{srv.url}/admin/tunables", headers=srv.admin_headers, timeout=10).json()["tunables"]
        bad, ok = (httpx.patch(f"{srv.url}/admin/tunables", headers=srv.admin_headers, timeout=10,
                               json={"values": {"engine.schedule_policy": name}}) for name in ("fifo", "priority"))
    assert first == again == plain and first
    spec = stats["tokenops-demo#0"]["spec_decode"]
    # the repeated request finds the first one's answer: most of its proposals are accepted
    assert spec["num_accepted_tokens"] >= 8 and spec["acceptance_rate"] > 0.3, spec
    assert "spec_decode" not in stats["plain#0"]
    policy = next(t for t in tunables if t["name"] == "engine.schedule_policy")
    assert policy["value"] == "sjf" and "sjf" in policy["choices"]
    assert bad.status_code == 400 and "sjf" in bad.text, bad.text  # the error names the registered orders
    assert ok.status_code == 200 and ok.json()["applied"] == {"engine.schedule_policy": "priority"}
