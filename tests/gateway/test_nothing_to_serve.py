"""When every configured model fails to load, a real ``tokenops serve`` exits non-zero and its
last line names the cause (as vLLM does) instead of answering ``/health`` with nothing to
serve. With one model failing beside one that loads it keeps serving
(tests/gateway/test_failed_model.py)."""

from __future__ import annotations

import subprocess

import pytest

from tests.serve_configs import config as serve_config, local_model
from tokenops.testing_serve import ServeProcess


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> str:
    """A real GPT-2 folder (random weights, transformers' own save_pretrained): an architecture
    the bundled engine does not run."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpt2") / "tiny-gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=32, n_layer=1, n_head=2, n_positions=64)).save_pretrained(path)
    return str(path)


def _serve(workdir, **kw) -> subprocess.CompletedProcess:
    cmd = ServeProcess(workdir, store=False, **kw).command()
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=300)


def test_serve_exits_naming_the_cause_when_its_only_model_fails(gpt2_dir, tmp_path):
    done = _serve(tmp_path, args=["--model", gpt2_dir])
    assert done.returncode != 0, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: nothing to serve: model 'tiny-gpt2' failed to load: UnsupportedModelError: "
                           "unsupported architecture GPT2LMHeadModel; supported: LlamaForCausalLM"), done.stderr
    assert "Gemma2ForCausalLM" in last and "Phi3ForCausalLM" in last
    assert "Traceback" not in done.stderr


def test_serve_exits_when_every_one_of_several_models_fails(gpt2_dir, tmp_path):
    missing = tmp_path / "no-weights"
    missing.mkdir()
    (missing / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama", '
                                         '"vocab_size": 32, "hidden_size": 8, "num_hidden_layers": 1, '
                                         '"num_attention_heads": 2, "intermediate_size": 16}')
    config = serve_config(local_model("gpt2", gpt2_dir), local_model("empty", missing))
    done = _serve(tmp_path / "srv", config=config)
    assert done.returncode != 0, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: nothing to serve: all 2 models failed to load; model 'gpt2' failed to load: "), last
    assert "GPT2LMHeadModel" in last and "model 'empty' failed to load: " in last and "safetensors" in last
