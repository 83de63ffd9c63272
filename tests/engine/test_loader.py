"""Loader: local folders, sharded safetensors, the HF cache, config spellings, errors;
and the embedded default model."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch

from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.models.loader import (
    ModelNotFoundError,
    UnsupportedModelError,
    load_model,
    model_args,
    resolve_model_dir,
)

IDS = [5, 17, 99, 3, 250, 41, 8]


def last_logits(model_dir, make_runner, **kw):
    runner = make_runner(model_dir, **kw)
    return runner.execute([ChunkInput(IDS, 0, [0, 1])])[0]


def test_sharded_checkpoint_loads_like_single_file(tiny_checkpoint, tmp_path, make_runner):
    from tiny_models import load_hf_model

    single = tiny_checkpoint("qwen2")
    hf = load_hf_model(single)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(str(sharded), max_shard_size="100KB")
    for f in single.glob("*token*"):
        shutil.copy(f, sharded)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    torch.testing.assert_close(last_logits(sharded, make_runner), last_logits(single, make_runner))


def test_bfloat16_runs_close_to_float32(tiny_llama_dir, make_runner):
    runner = make_runner(tiny_llama_dir, dtype="bfloat16")
    assert runner.kv_cache.dtype == torch.bfloat16
    assert next(runner.model.parameters()).dtype == torch.bfloat16
    assert runner.model.inv_freq.dtype == torch.float32  # RoPE table stays exact
    low = runner.execute([ChunkInput(IDS, 0, [0, 1])])[0]
    high = last_logits(tiny_llama_dir, make_runner)
    assert low.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(low, high, dim=0) > 0.99


def test_unsupported_architecture_names_the_supported_ones(tiny_llama_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        load_model(bad, torch.float32, torch.device("cpu"))


def test_unsupported_rope_type_is_reported(tiny_llama_dir):
    cfg = json.loads((tiny_llama_dir / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
    with pytest.raises(UnsupportedModelError, match="rope_type 'yarn'"):
        model_args(cfg)


def test_missing_weight_is_reported(tiny_llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="missing 1 weight.*layers.1.mlp.gate_up_proj"):
        load_model(broken, torch.float32, torch.device("cpu"))


def test_legacy_config_spelling_gives_same_args(tiny_llama_dir):
    cfg = json.loads((tiny_llama_dir / "config.json").read_text())
    legacy = dict(cfg)
    rope = dict(legacy.pop("rope_parameters"))
    legacy["rope_theta"] = rope.pop("rope_theta")
    legacy["rope_scaling"] = {"type" if k == "rope_type" else k: v for k, v in rope.items()}
    assert model_args(legacy) == model_args(cfg)
    assert model_args(cfg).rope_scaling["rope_type"] == "llama3"


def test_sliding_window_layers_from_each_config_style():
    base = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
            "num_hidden_layers": 3, "num_attention_heads": 2, "sliding_window": 4}  # fmt: skip
    assert model_args({**base, "use_sliding_window": False}).layer_windows == [None] * 3
    assert model_args({**base, "use_sliding_window": True, "max_window_layers": 1}).layer_windows == [None, 4, 4]
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    assert model_args({**base, "layer_types": types}).layer_windows == [4, None, 4]
    mistral = {**base, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    assert model_args(mistral).layer_windows == [4, 4, 4]


def test_local_folder_without_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model_dir(str(tmp_path))


def test_hub_id_not_cached_and_download_not_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache.*allow_download"):
        resolve_model_dir("nobody/no-such-model")
    with pytest.raises(ModelNotFoundError, match="no such folder"):
        resolve_model_dir("./missing/folder")


def test_hub_id_found_in_hf_cache(tiny_llama_dir, tmp_path, monkeypatch, make_runner):
    import huggingface_hub.constants as hf_constants

    hub = tmp_path / "hub"
    repo = hub / "models--tiny-org--tiny-llama"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_llama_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model_dir("tiny-org/tiny-llama") == repo / "snapshots" / commit
    runner = make_runner("tiny-org/tiny-llama")
    assert runner.model_name == "tiny-org/tiny-llama"


def test_default_random_model_created_once_offline(isolated_cache, monkeypatch, make_runner):
    from tokenops.engine.models import default_model

    monkeypatch.setattr(default_model, "shipped_model_dir", lambda: isolated_cache / "no-shipped-model")
    start = time.perf_counter()
    path = default_model.default_model_dir()
    assert time.perf_counter() - start < 5
    assert path.is_relative_to(isolated_cache) and (path / "model.safetensors").is_file()
    assert default_model.default_model_name() == "tokenops-random-llama"
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert default_model.default_model_dir() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp")]

    runner = make_runner(None, kv_cache_tokens=512)
    assert runner.model_name == "tokenops-random-llama"
    tok = runner.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "héllo 😀"}]))
    assert tok.decode(prompt) == "user\nhéllo 😀\nassistant\n"
    assert runner.vocab_size == tok.vocab_size == 259 and tok.eos_token_ids
    logits = runner.execute([ChunkInput(prompt, 0, list(range(8)))])
    assert logits.shape == (1, 259) and torch.isfinite(logits).all()


def test_shipped_demo_model_wins(tiny_llama_dir, isolated_cache, monkeypatch):
    from tokenops.engine.models import default_model

    monkeypatch.setattr(default_model, "shipped_model_dir", lambda: tiny_llama_dir)
    assert default_model.default_model_dir() == tiny_llama_dir
    assert default_model.default_model_name() == "tokenops-demo"
    assert not isolated_cache.exists()


def test_stacked_expert_tensors_load_like_per_expert_ones(tiny_checkpoint, tmp_path, make_runner):
    """Checkpoints that store experts stacked ([E, 2I, H] gate_up, [E, H, I] down) load too."""
    from safetensors.torch import load_file, save_file

    source = tiny_checkpoint("qwen2_moe")
    stacked = tmp_path / "stacked"
    shutil.copytree(source, stacked)
    tensors = load_file(str(stacked / "model.safetensors"))
    prefix = "model.layers.0.mlp.experts"
    num_experts = 4
    gate_up = [torch.cat([tensors.pop(f"{prefix}.{e}.gate_proj.weight"), tensors.pop(f"{prefix}.{e}.up_proj.weight")])
               for e in range(num_experts)]  # fmt: skip
    down = [tensors.pop(f"{prefix}.{e}.down_proj.weight") for e in range(num_experts)]
    tensors[f"{prefix}.gate_up_proj"] = torch.stack(gate_up)
    tensors[f"{prefix}.down_proj"] = torch.stack(down)
    save_file(tensors, str(stacked / "model.safetensors"))
    torch.testing.assert_close(last_logits(stacked, make_runner), last_logits(source, make_runner))
