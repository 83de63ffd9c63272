"""Tiny random GGUF files through a real ``tokenops serve``, driven by the openai SDK: named on
the command line (``--model NAME=FILE.gguf`` and a bare ``--model FILE.gguf``) and in
``[[models]] path``; greedy completions equal transformers' on the same file."""

from __future__ import annotations

import pytest
import torch

from tiny_gguf import load_hf_gguf, write_tiny_gguf
from tokenops.testing_serve import ServeProcess

NUM_NEW = 6
PROMPT = "the then there"
# tiny models on a loaded 2-core box; float32 activations in the quantized products, as transformers'
ONE_THREAD = {"TOKENOPS_ENGINE__TORCH_THREADS": "1", "TOKENOPS_QUANT_EXACT": "1"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf-serve")
    (folder / "llama").mkdir()
    (folder / "qwen2").mkdir()
    return {"llama": write_tiny_gguf(folder / "llama" / "tiny-llama.gguf", "llama", "Q4_K", seed=5),
            "qwen2": write_tiny_gguf(folder / "qwen2" / "tiny-qwen2.gguf", "qwen2", "Q4_0", seed=6)}


def _expected(path, tokenizer) -> str:
    hf = load_hf_gguf(path)
    hf.generation_config.eos_token_id = None
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          do_sample=False, max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, pad_token_id=0)
    new = out[0, len(ids):].tolist()
    stop = [i for i, t in enumerate(new) if t in tokenizer.eos_token_ids]
    return tokenizer.decode(new[: stop[0]] if stop else new)


def _complete(client, model: str) -> str:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=NUM_NEW, temperature=0)
    return r.choices[0].text


def test_gguf_files_served_from_the_command_line_and_the_config(tmp_path, files):
    import openai

    from tokenops.engine.models.loader import load_tokenizer

    expected = {arch: _expected(path, load_tokenizer(path)) for arch, path in files.items()}
    assert all(expected.values()), expected  # something to compare (no immediate end of sequence)
    args = ["--model", f"my-llama={files['llama']}", "--model", str(files["qwen2"])]
    with ServeProcess(tmp_path / "cli", args=args, env=ONE_THREAD, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        assert [m.id for m in client.models.list().data] == ["my-llama", "tiny-qwen2"]
        assert _complete(client, "my-llama") == expected["llama"]
        assert _complete(client, "tiny-qwen2") == expected["qwen2"]
    config = f'[engine]\ntorch_threads = 1\n\n[[models]]\nname = "qwen-gguf"\npath = "{files["qwen2"]}"\n'
    with ServeProcess(tmp_path / "config", config=config, env=ONE_THREAD, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        assert _complete(client, "qwen-gguf") == expected["qwen2"]
        chat = client.chat.completions.create(model="qwen-gguf", messages=[{"role": "user", "content": "the"}],
                                              max_tokens=4, temperature=0, stream=True)
        assert sum(1 for _ in chat) >= 1
