"""Features together on the real quantized default model through ``tokenops serve`` (issue 35, item 2).

SmolLM2-135M-Instruct from the packaged Q4_1 GGUF, with the documented ``[plugins.speculative]`` block (n-gram
speculation, k = 8), driven by the openai SDK: a rewrite request whose answer copies its text (drafts proposed
and accepted), then a structured-output request that shares its long system prompt (a prefix-cache hit,
JSON that validates), then raw token ids whose greedy continuation must equal the same engine's without
speculation. The engine's counters are read from the admin API.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai

from tests.real_model import MODEL, SERVE_ENV, gguf_path, serve_args
from tokenops.testing_serve import ServeProcess

REPO = Path(__file__).resolve().parents[2]
#: the documented settings, copied from the docs (not retyped)
CONFIG = re.search(r"```toml\n(# n-gram speculation on the default model.*?)```",
                   (REPO / "docs" / "engine-optimizations.md").read_text(), re.S).group(1)
SYSTEM = ("You are a careful copy editor. You keep the author's words and order, fix spelling and grammar, and "
          "answer with the corrected text only. ") * 3
TEXT = ("The harbour was quiet in the morning. Fishermen mended there nets on the pier while gulls circled "
        "over the boats, and the baker at the corner opened his shutters to sell warm bread to the first "
        "travellers of the day.")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
          "required": ["city", "sunny"], "additionalProperties": False}
PROMPT_IDS = [1, 9690, 198, 2683, 253, 1345, 2838, 563, 253, 9401, 638, 3680, 288, 5400, 30, 2, 198]


def _engine_stats(srv: ServeProcess) -> dict:
    engines = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=30).json()["engines"]
    return engines[f"{MODEL}#0"]


def _greedy_without_speculation(prompt: list[int], max_tokens: int) -> str:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(gguf_path()), device="cpu", kv_cache_tokens=1024, torch_threads=1))
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))[0]
    return out.outputs[0].text


def test_speculation_structured_output_and_prefix_cache_on_the_quantized_default(tmp_path):
    assert 'method = "ngram"' in CONFIG and "num_tokens = 8" in CONFIG
    args = serve_args()
    with ServeProcess(tmp_path, config=CONFIG, args=args, env=SERVE_ENV, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        system = {"role": "system", "content": SYSTEM}
        rewrite = client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=48,
            messages=[system, {"role": "user", "content": f"Correct this text:\n\n{TEXT}"}])
        assert "harbour" in rewrite.choices[0].message.content.lower()
        after_rewrite = _engine_stats(srv)
        structured = client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=48,
            messages=[system, {"role": "user", "content": "Describe the weather in Paris as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}})
        value = json.loads(structured.choices[0].message.content)
        assert set(value) == {"city", "sunny"} and isinstance(value["sunny"], bool)
        completion = client.completions.create(model=MODEL, prompt=PROMPT_IDS, max_tokens=32, temperature=0,
                                               extra_body={"ignore_eos": True})
        stats = _engine_stats(srv)
    spec = after_rewrite["spec_decode"]
    assert spec["num_drafts"] > 0 and spec["num_accepted_tokens"] > 0, spec  # the copy was proposed and kept
    assert stats["weight_format"].startswith("gguf Q4_1") and stats["panel_dtype"] == "gguf"
    assert stats["prefix_cache_hits"] > after_rewrite["prefix_cache_hits"]  # the shared system prompt
    details = structured.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens and details.cached_tokens >= 32, structured.usage
    assert stats["spec_decode"]["num_drafts"] > spec["num_drafts"]  # the token-id request speculated too
    assert completion.choices[0].text == _greedy_without_speculation(PROMPT_IDS, 32)

