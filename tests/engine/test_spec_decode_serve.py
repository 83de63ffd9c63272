"""The documented ``[plugins.speculative]`` block through a real ``tokenops serve``: the demo
target speculates for a lone request (disable_by_batch_size only stops it in large batches)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from tokenops.testing_serve import ServeProcess

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "tokenops" / "demo_models" / "target"
BLOCK = re.search(r"```toml\n(\[plugins\.speculative\].*?)```", (REPO / "docs" / "engine-optimizations.md").read_text(),
                  re.S).group(1).replace('"tokenops/demo_models/', f'"{REPO}/tokenops/demo_models/')
pytestmark = pytest.mark.skipif(not (TARGET / "config.json").is_file(), reason="demo target not trained")


def _spec_stats(node):
    if isinstance(node, dict):
        if "num_drafts" in node and "acceptance_rate" in node:
            return node
        node = list(node.values())
    if isinstance(node, list):
        for value in node:
            found = _spec_stats(value)
            if found is not None:
                return found
    return None


def test_documented_speculative_block_serves_with_drafts(tmp_path):
    assert "disable_by_batch_size = 8" in BLOCK
    config = f'[[models]]\nname = "target"\nbackend = "local"\npath = "{TARGET}"\n\n{BLOCK}'
    with ServeProcess(tmp_path, config=config, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        text = "the harbour boats and the gulls over the tide " * 6
        out = client.chat.completions.create(model="target", max_tokens=32, temperature=0,
                                             messages=[{"role": "user", "content": f"Repeat exactly: {text}"}])
        assert out.choices[0].message.content
        stats = _spec_stats(httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json())
        assert stats is not None and stats["num_drafts"] > 0, stats
