"""LoRA through a real ``tokenops serve`` driven by the openai SDK: ``--lora NAME=FOLDER`` on a tiny
random Llama; the adapter is a model of its own (``parent`` = the base), its streamed greedy text equals
transformers + peft's merged model's, and base and adapter requests run side by side."""

from __future__ import annotations

import threading

import openai
import pytest
import torch

from test_lora import ADAPTERS, NUM_NEW, hf_greedy, make_adapter, merged, prompts, tensor_bytes
from tiny_models import load_hf_model
from tokenops.engine.core.tokenizer import Tokenizer
from tokenops.testing_serve import ServeProcess

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def served(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_serve")
    adapter = make_adapter(tiny_llama_dir, root / "alpha", *ADAPTERS["alpha"])
    args = ["--model", f"tiny={tiny_llama_dir}", "--lora", f"alpha={adapter}"]
    # adapters loaded at run time (POST /admin/lora) come from the tests' temporary folders
    roots = {"TOKENOPS_LORA__ROOTS": str(tmp_path_factory.getbasetemp())}
    with ServeProcess(root / "serve", args=args, store=False, env=roots) as srv:
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


def test_json_schema_on_an_adapter_through_serve(served):
    """Structured outputs on adapter rows: the schema's grammar masks the adapter's logits."""
    import json

    srv, _, _ = served
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    out = client.chat.completions.create(
        model="alpha", messages=[{"role": "user", "content": "A number and a flag as JSON."}], max_tokens=40,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "nf", "schema": schema}})
    assert out.model == "alpha"
    assert set(json.loads(out.choices[0].message.content)) == {"n", "ok"}


def _cli(srv, *args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tokenops", "lora", *args, "--url", srv.url],
                          env={**__import__("os").environ, "TOKENOPS_ADMIN_KEY": srv.admin_key},
                          capture_output=True, text=True, timeout=120)


def test_runtime_load_and_unload_through_cli_and_admin_api(served, tmp_path):
    import httpx

    srv, base_dir, _ = served
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
    beta = make_adapter(base_dir, tmp_path / "beta", *ADAPTERS["beta"])
    bad = make_adapter(base_dir, tmp_path / "bad", *ADAPTERS["beta"])
    cfg = bad / "adapter_config.json"
    cfg.write_text(cfg.read_text().replace('"r": 4', '"r": 16'))
    out = _cli(srv, "load", f"bad={bad}")
    assert out.returncode != 0 and "rank 16" in out.stderr + out.stdout
    out = _cli(srv, "load", f"beta={beta}", "--json")
    assert out.returncode == 0, out.stderr
    assert json_of(out)["parent"] == "tiny"
    listed = json_of(_cli(srv, "list", "--json"))["adapters"]
    assert {a["name"] for a in listed} == {"alpha", "beta"}
    for a in listed:  # memory per adapter: exactly the file's matrices
        assert a["bytes"] == tensor_bytes(a["path"]), a
    assert "beta" in {m.id for m in client.models.list().data} and "bad" not in {m.id for m in client.models.list().data}
    with torch.no_grad():
        want = Tokenizer.from_dir(base_dir).decode(hf_greedy(merged(base_dir, beta), prompts()[0]))
    stream = client.completions.create(model="beta", prompt=prompts()[0], max_tokens=NUM_NEW, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.text for chunk in stream for c in chunk.choices) == want
    assert _cli(srv, "unload", "beta").returncode == 0
    assert "beta" not in {m.id for m in client.models.list().data}
    r = httpx.delete(f"{srv.url}/admin/lora/beta", headers=srv.admin_headers)
    assert r.status_code == 404 and r.json()["error"]["code"] == "lora_not_found"
    r = httpx.post(f"{srv.url}/admin/lora", headers=srv.admin_headers, json={"name": "x", "path": str(beta), "rank": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "rank"


def json_of(out):
    import json

    return json.loads(out.stdout)
