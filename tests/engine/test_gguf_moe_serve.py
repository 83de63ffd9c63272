"""A GGUF mixture-of-experts file (a tiny Qwen2-MoE as llama.cpp writes it: Q4_K experts, Q8_0 attention,
a shared expert) served by a real ``tokenops serve --model FILE.gguf`` and asked through the openai
SDK: the greedy completion is transformers' on the weights the file decodes to, a chat request is
answered, and the routed tokens show in the engine stats (``/admin/stats``'s ``expert_load``, what
the dashboard's heatmap and the ``expert_load`` telemetry rows read)."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from tiny_gguf_moe import write_moe_gguf
from tokenops.testing_serve import ServeProcess

pytestmark = pytest.mark.slow  # a server start and a transformers load: 55-100 s on the loaded 2-core box

NUM_NEW = 6
PROMPT = "the quick brown"
# a tiny model on a loaded 2-core box; float32 activations in the quantized products, as transformers'
ONE_THREAD = {"TOKENOPS_ENGINE__TORCH_THREADS": "1", "TOKENOPS_QUANT_EXACT": "1"}


def _expected(hf, tokenizer) -> str:
    hf.generation_config.eos_token_id = None
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          do_sample=False, max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, pad_token_id=0)  # fmt: skip
    new = out[0, len(ids) :].tolist()
    stop = [i for i, t in enumerate(new) if t in tokenizer.eos_token_ids]
    return tokenizer.decode(new[: stop[0]] if stop else new)


def test_moe_gguf_served_answers_and_reports_expert_load(tmp_path):
    from tokenops.engine.models.loader import load_tokenizer

    (tmp_path / "model").mkdir()
    path, hf = write_moe_gguf("qwen2_moe", tmp_path / "model" / "tiny-moe.gguf", experts="Q4_K", others="Q8_0")
    expected = _expected(hf, load_tokenizer(path))
    assert expected  # something to compare (no immediate end of sequence)
    with ServeProcess(tmp_path / "serve", args=["--model", str(path)], env=ONE_THREAD, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused-on-loopback", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["tiny-moe"]
        text = client.completions.create(model="tiny-moe", prompt=PROMPT, max_tokens=NUM_NEW, temperature=0)
        assert text.choices[0].text == expected
        chat = client.chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "hello"}],
                                              max_tokens=8, temperature=0)  # fmt: skip
        assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage is not None
        assert chat.usage.completion_tokens >= 1 and chat.usage.prompt_tokens > 1
        stats = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers, timeout=60).json()
    [engine] = [e for e in stats["engines"].values() if e.get("expert_load") is not None]
    load = engine["expert_load"]
    assert len(load) == 2 and all(len(row) == 4 for row in load)  # two sparse layers of four experts
    routed = chat.usage.prompt_tokens + text.usage.prompt_tokens  # at least the prompts, top-2 per token
    assert all(sum(row) >= 2 * routed for row in load), load
    assert "Q4_K" in engine["weight_format"], engine["weight_format"]
