"""Issue 21: capture through a real ``tokenops serve`` driven by the openai SDK.

An opted-in tenant's answers of the chosen model are kept; another tenant's are not;
the admin API and ``tokenops distill purge`` delete them; ``export`` writes chat JSONL."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from tokenops.testing_serve import ServeProcess

REPO = Path(__file__).resolve().parents[2]
LARGE = REPO / "tokenops" / "demo_models" / "ladder-large"

CONFIG = f"""
[[models]]
name = "ladder-large"
path = "{LARGE}"

[gateway]
api_keys = {{ "key-acme" = "acme", "key-other" = "other" }}

[plugins.distill_capture]
models = ["ladder-large"]
tenants = ["acme"]
retention_days = 30
max_rows = 1000
"""

PROMPT = 'Extract a JSON object with keys "name", "city" and "age" (integer) from: "Dana moved to Oslo last spring ' \
         'and turned 41 in May." Reply with JSON only.'


def _pairs(srv: ServeProcess) -> dict[str, int]:
    deadline = time.monotonic() + 15
    while True:
        r = httpx.get(f"{srv.url}/admin/distill/pairs", headers=srv.admin_headers, timeout=10)
        assert r.status_code == 200, r.text
        counts = {p["tenant"]: p["count"] for p in r.json()["pairs"]}
        if counts or time.monotonic() > deadline:
            return counts
        time.sleep(0.3)


# 29 s; capture through serve stays in the default run in test_quality_filter.py, and a tenant's
# purge in tests/keys/test_tenant_delete_serve.py
@pytest.mark.slow
def test_capture_opt_in_tenant_only_then_purge(tmp_path):
    from tokenops.cli import build_app

    with ServeProcess(tmp_path, config=CONFIG) as srv:
        for key, n in (("key-acme", 2), ("key-other", 2)):
            client = openai.OpenAI(base_url=srv.base_url, api_key=key)
            for _ in range(n):
                out = client.chat.completions.create(model="ladder-large", max_tokens=24, temperature=0,
                                                     messages=[{"role": "user", "content": PROMPT}])
                assert out.choices[0].message.content
        counts = _pairs(srv)
        assert counts == {"acme": 2}, counts  # never the tenant that did not opt in

        # export while the server holds the store (through its store channel)
        out_file = tmp_path / "pairs.jsonl"
        res = CliRunner().invoke(build_app(), ["distill", "export", "--store", str(srv.store_path), "-o", str(out_file),
                                               "--json", "--keep-truncated"])
        assert res.exit_code == 0, res.output
        lines = [json.loads(x) for x in out_file.read_text().splitlines()]
        assert len(lines) == 2
        for line in lines:
            assert [m["role"] for m in line["messages"]] == ["user", "assistant"]
            assert line["messages"][0]["content"] == PROMPT and line["messages"][1]["content"]

        r = httpx.delete(f"{srv.url}/admin/distill/pairs", params={"tenant": "acme"}, headers=srv.admin_headers)
        assert r.status_code == 200 and r.json() == {"tenant": "acme", "deleted": 2}, r.text
        r = httpx.delete(f"{srv.url}/admin/distill/pairs", headers=srv.admin_headers)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tenant"
        assert httpx.get(f"{srv.url}/admin/distill/pairs", timeout=10).status_code in (401, 403)

        client = openai.OpenAI(base_url=srv.base_url, api_key="key-acme")
        client.chat.completions.create(model="ladder-large", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert _pairs(srv) == {"acme": 1}
        res = CliRunner().invoke(build_app(), ["distill", "purge", "--tenant", "acme", "--store", str(srv.store_path),
                                               "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output) == {"tenant": "acme", "deleted": 1}
        assert _pairs(srv) == {}

        # a streamed answer is captured too, as the client received it
        chunks = client.chat.completions.create(model="ladder-large", max_tokens=16, temperature=0, stream=True,
                                                messages=[{"role": "user", "content": PROMPT}])
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed and _pairs(srv) == {"acme": 1}
        out_file = tmp_path / "streamed.jsonl"
        res = CliRunner().invoke(build_app(), ["distill", "export", "--store", str(srv.store_path), "-o", str(out_file),
                                               "--keep-truncated"])  # max_tokens 16 may cut it (finish_reason length)
        assert res.exit_code == 0, res.output
        (line,) = [json.loads(x) for x in out_file.read_text().splitlines()]
        assert line["messages"][1]["content"] == streamed
