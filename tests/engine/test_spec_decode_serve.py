"""The documented ``[plugins.speculative]`` block through a real ``tokenops serve``: the demo
target speculates for a lone request (disable_by_batch_size only stops it in large batches)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from tests.serve_configs import config as serve_config, local_model
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
    config = serve_config(local_model("target", TARGET), BLOCK)
    with ServeProcess(tmp_path, config=config, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        text = "the harbour boats and the gulls over the tide " * 6
        out = client.chat.completions.create(model="target", max_tokens=32, temperature=0,
                                             messages=[{"role": "user", "content": f"Repeat exactly: {text}"}])
        assert out.choices[0].message.content
        stats = _spec_stats(httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json())
        assert stats is not None and stats["num_drafts"] > 0, stats


DRAFT_BLOCK = re.search(r"```toml\n(# the demo pair's best measured settings.*?)```",
                        (REPO / "docs" / "engine-optimizations.md").read_text(), re.S)


def test_documented_draft_block_serves_the_targets_greedy_output(tmp_path):
    """The recommended draft settings (k = 8, the confidence stop at 0.1, the draft's weights in
    bfloat16 by default) through ``tokenops serve`` with the openai SDK: the target's own greedy
    tokens, with drafts proposed and accepted."""
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams

    assert DRAFT_BLOCK is not None, "the draft block is gone from docs/engine-optimizations.md"
    block = DRAFT_BLOCK.group(1).replace('"tokenops/demo_models/', f'"{REPO}/tokenops/demo_models/')
    assert "num_tokens = 8" in block and "draft_min_confidence = 0.1" in block
    config = serve_config(local_model("target", TARGET), block)
    prompt = [1, 44, 316, 1070, 301, 620, 282, 3097, 16, 4, 75, 281]
    with ServeProcess(tmp_path, config=config, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        out = client.completions.create(model="target", prompt=prompt, max_tokens=48, temperature=0,
                                         extra_body={"ignore_eos": True})
        stats = _spec_stats(httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json())
    assert stats is not None and stats["num_drafts"] > 0 and stats["num_accepted_tokens"] > 0, stats
    engine = LLMEngine(EngineConfig(model=str(TARGET), device="cpu"))
    reference = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))[0]
    assert out.choices[0].text == reference.outputs[0].text
