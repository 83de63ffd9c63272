"""GGUF types read by transcoding to Q8_0 at load (tokenops/engine/gguf/gguf_transcode.py): Q5_0, Q5_1,
Q2_K, Q3_K, IQ4_NL and IQ4_XS decode as ``gguf.quants.dequantize`` does (random valid blocks: every
code, scale and bit pattern), the Q8_0 re-encoding stays within Q8_0's rounding, and a model whose
file mixes them in loads and computes what transformers computes from the same file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as reference

from tokenops.engine.gguf.gguf_quants import QUANT_TYPES, TRANSCODED_TO_Q8_0, dequantize
from tokenops.engine.gguf.gguf_transcode import requantize_q8_0

#: where each type's float16 scales sit in its block (kept small and finite in random blocks)
SCALE_OFFSETS = {QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.IQ4_NL: (0,),
                 QT.IQ4_XS: (0,)}


def random_blocks(qtype: QT, rows: int, columns: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, columns // block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for at in SCALE_OFFSETS[qtype]:
        blocks[:, at:at + 2] = rng.uniform(1e-3, 2e-2, blocks.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


@pytest.mark.parametrize("qtype", list(SCALE_OFFSETS), ids=lambda t: t.name)
def test_decoding_matches_gguf_reference(qtype):
    assert int(qtype) in TRANSCODED_TO_Q8_0
    raw = random_blocks(qtype, 6, 512)
    ours = dequantize(torch.from_numpy(raw.copy()), QUANT_TYPES[int(qtype)])
    ref = torch.from_numpy(reference(raw, qtype).astype(np.float32)).reshape(6, 512)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)


def test_q8_0_reencoding_is_within_its_rounding_and_matches_gguf_reading():
    w = torch.randn(4, 256) * 0.05
    raw = requantize_q8_0(w)
    back = torch.from_numpy(reference(raw.numpy(), QT.Q8_0).astype(np.float32)).reshape(4, 256)
    step = w.reshape(4, 8, 32).abs().amax(-1, keepdim=True) / 127
    assert ((back - w).reshape(4, 8, 32).abs() <= step * 0.5 + 1e-6).all()


@pytest.mark.parametrize("mixed", ["Q5_0", "Q5_1"])
def test_a_file_mixing_a_transcoded_type_loads_and_matches_transformers(tmp_path, mixed):
    """A Q8_0 file with one Q5_x tensor (as llama.cpp's Q4_K_M files carry): it loads (it was refused
    with one line), is held as Q8_0, and its logits match transformers' on the same file."""
    from tiny_gguf import write_tiny_gguf

    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q8_0", tensor_types={"blk.1.ffn_up.weight": mixed})
    # two-byte activations: the comparison is about the re-encoding, not the activation rounding
    runner = ModelRunner(
        EngineConfig(model=str(path), device="cpu", block_size=4, kv_cache_tokens=64, quant_act_bytes=2)
    )
    assert f"{mixed}>Q8_0x1" in (runner.weight_format or "")
    from transformers import AutoModelForCausalLM

    from tokenops.engine.core.batch import ChunkInput

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf").eval()

    ids = [5, 9, 17, 2, 33, 8]
    ours = runner.execute([ChunkInput(ids, 0, list(range(8)), num_logits=len(ids))])
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    # Q8_0 re-encoding of 5-bit values: far below the 5-bit steps; two-byte activations on top
    error = ((ours.float() - theirs).abs().max() / theirs.abs().max()).item()
    print(f"{mixed}: largest logit difference / largest logit = {error:.2e}")
    assert error < 1e-2
