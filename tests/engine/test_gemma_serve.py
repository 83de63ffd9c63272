"""A Gemma 2 folder through a real ``tokenops serve`` with the openai SDK: the chat answer
(one piece and streamed) is transformers' greedy continuation of the same chat prompt."""

from __future__ import annotations

import openai
import torch

from tiny_models import load_hf_model
from tokenops.testing_serve import ServeProcess

MESSAGES = [{"role": "user", "content": "the lazy dog. hello there."}]  # a varied greedy answer
MAX_TOKENS = 12


def _hf_answer(path) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    hf = load_hf_model(path)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          do_sample=False, max_new_tokens=MAX_TOKENS, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
    new = out[0, len(ids):].tolist()
    return tok.decode([t for t in new if t != tok.eos_token_id], skip_special_tokens=True)


def test_gemma2_folder_serves_transformers_greedy_answer(tiny_checkpoint, tmp_path):
    path = tiny_checkpoint("gemma2")
    expected = _hf_answer(path)
    assert expected.strip()
    with ServeProcess(tmp_path, args=["--model", f"gemma2={path}"], store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["gemma2"]
        got = client.chat.completions.create(model="gemma2", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
        assert got.choices[0].message.content == expected
        stream = client.chat.completions.create(model="gemma2", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
