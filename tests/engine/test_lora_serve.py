"""LoRA through a real ``tokenops serve`` driven by the openai SDK: ``--lora NAME=FOLDER`` on a tiny
random Llama; the adapter is a model of its own (``parent`` = the base), its streamed greedy text equals
transformers + peft's merged model's, and base and adapter requests run side by side."""

from __future__ import annotations

import threading

import openai
import pytest
import torch

from test_lora import ADAPTERS, NUM_NEW, hf_greedy, make_adapter, merged, prompts
from tiny_models import load_hf_model
from tokenops.engine.tokenizer import Tokenizer
from tokenops.testing_serve import ServeProcess

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def served(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_serve")
    adapter = make_adapter(tiny_llama_dir, root / "alpha", *ADAPTERS["alpha"])
    args = ["--model", f"tiny={tiny_llama_dir}", "--lora", f"alpha={adapter}"]
    with ServeProcess(root / "serve", args=args, store=False) as srv:
        yield srv, tiny_llama_dir, adapter


def test_adapter_by_name_streamed_through_serve(served):
    srv, base_dir, adapter = served
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"tiny", "alpha"}
    assert cards["alpha"].model_extra["parent"] == "tiny" and cards["tiny"].model_extra["parent"] is None
    tok = Tokenizer.from_dir(base_dir)
    prompt = prompts()[1]
    with torch.no_grad():
        want = {"alpha": tok.decode(hf_greedy(merged(base_dir, adapter), prompt)),
                "tiny": tok.decode(hf_greedy(load_hf_model(base_dir), prompt))}
    assert want["alpha"] != want["tiny"]
    got: dict[str, str] = {}

    def run(model: str) -> None:  # both at once: base and adapter rows share the engine's steps
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=NUM_NEW, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        parts = []
        for chunk in stream:
            assert chunk.model == model
            parts.extend(c.text for c in chunk.choices)
        got[model] = "".join(parts)

    threads = [threading.Thread(target=run, args=(m,)) for m in ("alpha", "tiny")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want
    chat = client.chat.completions.create(model="alpha", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4, temperature=0, stream=True)
    chunks = list(chat)
    assert chunks and all(c.model == "alpha" for c in chunks)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gamma", prompt="x", max_tokens=1)
