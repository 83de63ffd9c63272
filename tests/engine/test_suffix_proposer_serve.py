"""The ``suffix`` proposer on the real default model through ``tokenops serve`` (issue 35, item 3).

SmolLM2-135M-Instruct from the packaged Q4_1 GGUF with the documented ``[plugins.speculative]`` block
(``method = "suffix"``: prompt lookup plus the shipped corpus of the model's own answers), driven by
the openai SDK with a streamed chat request whose answer copies nothing from its prompt: drafts come
from the corpus and are accepted, and the streamed text equals the same engine's greedy answer
without speculation.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai

from tests.real_model import MODEL, SERVE_ENV, gguf_path, serve_args
from tokenops.testing_serve import ServeProcess

REPO = Path(__file__).resolve().parents[2]
#: the documented settings, copied from the docs (not retyped)
CONFIG = re.search(
    r"```toml\n(# suffix speculation on the default model.*?)```",
    (REPO / "docs" / "engine-optimizations.md").read_text(),
    re.S,
).group(1)
#: not a ShareGPT prompt (the corpus holds answers to ShareGPT prompts), a common kind of request
QUESTION = "What are some tips for staying productive while working from home?"
MAX_TOKENS = 64
#: two-byte activations on both sides: with one byte (the default) a verify chunk's float rounding can
#: move an activation's one-byte code, and the greedy answers part (docs/engine-optimizations.md)
ENV = {**SERVE_ENV, "TOKENOPS_QUANT_ACT_BYTES": "2"}


def _greedy_without_speculation(messages: list[dict]) -> str:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams

    engine = LLMEngine(
        EngineConfig(model=str(gguf_path()), device="cpu", kv_cache_tokens=1024, torch_threads=1, quant_act_bytes=2)
    )
    text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    prompt = engine.tokenizer.encode(text, add_special_tokens=False)
    return engine.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_TOKENS))[0].outputs[0].text


def test_suffix_speculation_serves_chat_with_corpus_drafts(tmp_path):
    assert 'method = "suffix"' in CONFIG
    messages = [{"role": "user", "content": QUESTION}]
    with ServeProcess(tmp_path, config=CONFIG, args=serve_args(), env=ENV, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        stream = client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=MAX_TOKENS, messages=messages, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        engines = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=30).json()["engines"]
    spec = engines[f"{MODEL}#0"]["spec_decode"]
    corpus = spec["proposer"]["corpus"]
    assert corpus["num_drafts"] > 0 and corpus["num_accepted_tokens"] > 0, spec
    assert text == _greedy_without_speculation(messages)
