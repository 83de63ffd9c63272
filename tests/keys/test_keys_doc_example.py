"""docs/keys.md's example, as written (curl, read from the page), works on a plain
`tokenops serve`: the tenant is set, the key is created, and it acts (its models only)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import openai
import pytest

from tokenops.testing_serve import ServeProcess

DOC = Path(__file__).resolve().parents[2] / "docs" / "keys.md"


def _example() -> str:
    text = DOC.read_text()
    block = re.search(r"Example, on a plain `tokenops serve`.*?```bash\n(.*?)```", text, flags=re.S)
    assert block, "docs/keys.md lost its example"
    return block.group(1)


def test_the_documented_key_example_works_on_a_default_server(tmp_path):
    with ServeProcess(tmp_path, admin_key="") as srv:  # a plain serve: the key is in store/admin_key
        script = _example().replace("localhost:8000", f"127.0.0.1:{srv.port}")
        env = dict(os.environ, ADMIN=(tmp_path / "store" / "admin_key").read_text().strip())
        out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        answers, rest, decoder = [], out.stdout.strip(), json.JSONDecoder()
        while rest:  # curl -s prints the answers back to back
            obj, end = decoder.raw_decode(rest)
            answers.append(obj)
            rest = rest[end:].strip()
        tenant, created = answers
        assert tenant.get("budget_usd") == 50, tenant
        assert created["tenant"] == "acme" and created["key"].startswith("tok-"), out.stdout
        client = openai.OpenAI(base_url=srv.base_url, api_key=created["key"], max_retries=0)
        r = client.chat.completions.create(model="tokenops-ladder-small", max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content is not None
        with pytest.raises(openai.PermissionDeniedError):  # not in the key's models
            client.chat.completions.create(model="tokenops-demo", max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}])
