"""Gemma (1, 2, 3) and Phi-3 GGUF files (tiny, random, written as llama.cpp's converter writes
them: tests/engine/tiny_gguf.py) against transformers loading the same file (``gguf_file=``):
prefill logits and greedy tokens through chunked prefill and paged decodes, weights as F32 and
Q8_0. Phi-3's LongRoPE and partial rotation, which transformers does not read from a GGUF, and
Gemma 1, whose GGUFs it does not load, are compared with the folder the file was written from."""

from __future__ import annotations

import pytest
import torch

from test_models_parity import greedy_paged, hf_greedy, prompt, scattered_blocks
from tiny_gguf_hf import write_gguf_from_hf
from tiny_models import load_hf_model
from tokenops.engine.core.batch import ChunkInput

def _hf_from_gguf(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager")
    return model.eval()


@pytest.fixture(autouse=True)
def exact_activations(monkeypatch):
    """Float32 activations in the native quantized products: transformers multiplies float32 ones, and
    these comparisons are to float32 rounding (test_gguf_models checks the default rounded activations)."""
    monkeypatch.setenv("TOKENOPS_QUANT_EXACT", "1")


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf")


@torch.no_grad()
@pytest.mark.parametrize(("arch", "quant"), [("gemma2_gguf", "F32"), ("gemma2_gguf", "Q8_0"), ("gemma3_gguf", "Q8_0"),
                                             ("phi3_gguf", "F32"), ("phi3_gguf", "Q8_0")])
def test_gguf_greedy_matches_transformers_on_the_same_file(arch, quant, tiny_checkpoint, gguf_dir, make_runner):
    path = write_gguf_from_hf(tiny_checkpoint(arch), gguf_dir / f"{arch}-{quant}.gguf", quant)
    runner, hf = make_runner(path, kv_cache_tokens=256), _hf_from_gguf(path)
    assert runner.weight_format.startswith(f"gguf {quant}x")  # the weights stay in the file's encoding
    ids = prompt(2)
    ref = hf(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(runner.execute([ChunkInput(ids, 0, scattered_blocks(4, 1))])[0], ref,
                               atol=1e-4, rtol=1e-4)
    tokens, _ = greedy_paged(runner, ids, 10, splits=[5, 9], table=scattered_blocks(8, 3))
    assert tokens == hf_greedy(hf, ids, 10), arch


@torch.no_grad()
@pytest.mark.parametrize("arch", ["phi3_longrope", "gemma"])
def test_gguf_matches_its_source_folder_where_transformers_cannot_read_it(arch, tiny_checkpoint, gguf_dir, make_runner):
    """Phi-3's rope factors as tensors, attention factor and rope.dimension_count (past the original
    64-token context too), and Gemma 1, whose GGUFs transformers does not load: the same logits and
    greedy tokens as transformers on the folder the file was written from."""
    folder = tiny_checkpoint(arch)
    path = write_gguf_from_hf(folder, gguf_dir / f"{arch}.gguf")
    runner, hf = make_runner(path, kv_cache_tokens=256), load_hf_model(folder)
    if arch == "phi3_longrope":
        assert runner.args.rotary_dim == 8 and runner.args.rope_scaling["rope_type"] == "longrope"
    for n in (13, 70):
        ids = prompt(9, n)
        table = scattered_blocks(22, n)
        tokens, seen = greedy_paged(runner, ids, 6, splits=[], table=table)
        torch.testing.assert_close(seen[0], hf(torch.tensor([ids])).logits[0, -1], atol=1e-4, rtol=1e-4)
        assert tokens == hf_greedy(hf, ids, 6), n


def test_gguf_gemma2_reads_llama_cpps_derived_fields(tiny_checkpoint, gguf_dir, make_runner):
    path = write_gguf_from_hf(tiny_checkpoint("gemma2_gguf"), gguf_dir / "gemma2-route.gguf")
    runner = make_runner(path)
    assert runner.native_attention is None  # soft caps: the PyTorch forward's attention is not the native kernel
    assert runner.args.attn_softcap == 50.0 and runner.args.final_softcap == 30.0
    assert runner.args.query_pre_attn_scalar == 256 and runner.args.layer_windows == [5, None]
