"""The packed K-quant kernels (Q4_K, Q5_K, Q6_K) inside the fused decode step, on tiny GGUF models
(``tiny_gguf.py``: dims multiples of 256, random blocks): every weight packed at load, the fused step
running prefill and decode, and its greedy continuation equal to that of transformers loading the same
file dequantized to float32; and the 512-bit and 256-bit packed kernels giving the same logits."""

from __future__ import annotations

import pytest
import torch
from tiny_gguf import load_hf_gguf, write_tiny_gguf
from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.kernels import quant_kernels

NUM_NEW = 12


def _needs_kernels() -> None:
    kernels = quant_kernels.get_kernels()
    if kernels is None or not kernels.has_avx2:
        pytest.skip("the fused step's quantized products need a C compiler and AVX2")


def _runner(path, monkeypatch: pytest.MonkeyPatch):
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    monkeypatch.setenv("TOKENOPS_QUANT_EXACT", "0")
    # two-byte activations: greedy tokens equal to transformers' on the float weights (one byte, llama.cpp's
    # rounding, flips near-tied tokens of this random model; tests/engine/test_quant_act_bytes.py checks it)
    return ModelRunner(
        EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_tokens=128, torch_threads=1, quant_act_bytes=2)
    )


@torch.no_grad()
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
def test_fused_step_greedy_equals_dequantized_float32(tmp_path, monkeypatch, qtype: str) -> None:
    from tokenops.engine.kernels.quantized_linear import QuantizedWeight

    _needs_kernels()
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", qtype, seed=3)
    runner = _runner(path, monkeypatch)
    weights = {id(m): m for m in runner.model.modules() if isinstance(m, QuantizedWeight)}.values()
    assert weights and all(w.packed is not None for w in weights)  # every K-quant weight packed at load
    assert runner.fused_decode is not None
    ids = torch.randint(0, 256, (11,), generator=torch.Generator().manual_seed(2)).tolist()
    table = list(range(32))
    logits = runner.execute([ChunkInput(ids, 0, table)])[0]
    ours, seq = [], list(ids)
    for _ in range(NUM_NEW):
        ours.append(int(logits.argmax()))
        seq.append(ours[-1])
        logits = runner.execute([ChunkInput(seq[-1:], len(seq) - 1, table)])[0]
    assert runner.num_fused_steps == NUM_NEW + 1

    hf = load_hf_gguf(path)
    hf.generation_config.eos_token_id = None
    ref = hf(torch.tensor([seq])).logits[0, -NUM_NEW:]
    out = hf.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=NUM_NEW,
        min_new_tokens=NUM_NEW,
        pad_token_id=0,
    )
    assert ours == out[0, len(ids) :].tolist(), qtype
    # teacher-forced along the same tokens, the logits are within the two-byte activations' rounding
    fused = runner.execute([ChunkInput(seq, 0, table, num_logits=NUM_NEW)])
    err = ((fused - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()
    print(f"{qtype}: {NUM_NEW} greedy tokens equal; largest logit difference {err:.2e} of the largest logit")
    assert err < 1e-3, err


@torch.no_grad()
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_avx512_and_avx2_products_agree_in_the_engine(tmp_path, monkeypatch, qtype: str) -> None:
    """The same model's logits with the 512-bit packed kernels and with the 256-bit ones (the
    switch ``quant_avx512 = False``), in the PyTorch forward that calls this library."""
    _needs_kernels()
    kernels = quant_kernels.get_kernels()
    assert kernels is not None
    if not kernels.has_avx512:
        pytest.skip("this CPU (or build) has no AVX-512 VNNI")
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", qtype, seed=4)
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    monkeypatch.setenv("TOKENOPS_QUANT_EXACT", "0")
    runner = ModelRunner(
        EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_tokens=128, decode_kernel="torch")
    )
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    chunk = ChunkInput(ids, 0, list(range(16)), num_logits=40)
    try:
        assert kernels.set_avx512(True)
        wide = runner.execute([chunk])
        assert not kernels.set_avx512(False)
        narrow = runner.execute([chunk])
    finally:
        kernels.set_avx512(None)  # back to the engine's quant_avx512
    assert torch.equal(wide, narrow)


def test_kquant_gguf_served_through_the_fused_step(tmp_path) -> None:
    """A Q6_K file (packed at load, the fused step with two-byte activations, the 512-bit kernels where
    the CPU has them) through a real ``tokenops serve`` and the openai SDK: the greedy completion is
    transformers' on the same file dequantized to float32."""
    import httpx
    import openai
    from tokenops.engine.models.loader import load_tokenizer
    from tokenops.testing_serve import ServeProcess

    _needs_kernels()
    path = write_tiny_gguf(tmp_path / "tiny-q6k.gguf", "llama", "Q6_K", seed=5)
    tokenizer = load_tokenizer(path)
    ids = tokenizer.encode("the then there", add_special_tokens=False)
    hf = load_hf_gguf(path)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=NUM_NEW,
            min_new_tokens=NUM_NEW,
            pad_token_id=0,
        )
    new = out[0, len(ids) :].tolist()
    stop = [i for i, t in enumerate(new) if t in tokenizer.eos_token_ids]
    expected = tokenizer.decode(new[: stop[0]] if stop else new)
    assert expected
    # two bytes: one byte (the default, llama.cpp's rounding) flips near-tied tokens of this random model
    env = {"TOKENOPS_ENGINE__TORCH_THREADS": "1", "TOKENOPS_QUANT_EXACT": "0", "TOKENOPS_QUANT_ACT_BYTES": "2"}
    with ServeProcess(tmp_path / "serve", args=["--model", f"q6k={path}"], env=env, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        r = client.completions.create(model="q6k", prompt="the then there", max_tokens=NUM_NEW, temperature=0)
        assert r.choices[0].text == expected
        stats = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=30).json()["engines"]["q6k#0"]
        assert stats["weight_format"].startswith("gguf Q6_K") and stats["forward"] == "fused"
        assert stats["panel_dtype"] == "gguf" and stats["fused_decode_steps"] > 0
        assert stats["quant_kernels"].split("+")[0] in ("avx512-vnni", "avx2-vnni", "avx2"), stats["quant_kernels"]


@torch.no_grad()
@pytest.mark.parametrize("act_bytes", [2, 1])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_step_chains_a_qkv_of_mixed_encodings(tmp_path, monkeypatch, arch: str, act_bytes: int) -> None:
    """A q/k/v whose v is stored in another format (as llama.cpp's Q4_K_M files keep v in Q6_K) is a
    chain of qk_weight records in the fused step (the activations quantized once for its parts, qwen2's
    bias split with them): the step runs such a model, its logits those of the PyTorch forward, which
    multiplies part by part, with two- and one-byte activations (one: within a code step of rounding)."""
    _needs_kernels()
    path = write_tiny_gguf(tmp_path / "m.gguf", arch, "Q4_K", seed=6, tensor_types={"blk.0.attn_v.weight": "Q8_0"})
    runner = _runner(path, monkeypatch)
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert [p.qtype.name for p in qkv.parts] == ["Q4_K", "Q8_0"]  # q and k in one part
    assert runner.fused_decode is not None
    kernels = quant_kernels.get_kernels()
    assert kernels is not None
    from fused_checks import fused_and_reference
    from tokenops.engine.kernels import switches

    ids = torch.randint(0, 256, (21,), generator=torch.Generator().manual_seed(7)).tolist()
    table = list(range(32))
    try:
        for lib in switches._libraries:  # the fused library and the kernels' own: both multiply
            lib.qk_set_act_bytes(act_bytes)
        for chunk in (ChunkInput(ids, 0, table, num_logits=len(ids)), ChunkInput(ids[-1:], len(ids), table)):
            fused, reference, _ = fused_and_reference(runner, [chunk])
            err = ((fused - reference).abs().amax(-1) / reference.abs().amax(-1)).max().item()
            # one byte: a float32 rounding apart between the two forwards can move an activation's code by one
            assert err < (1e-4 if act_bytes == 2 else 2e-3), (chunk.start_pos, err)
    finally:
        for lib in switches._libraries:
            lib.qk_set_act_bytes(int(switches.current.quant_act_bytes))
