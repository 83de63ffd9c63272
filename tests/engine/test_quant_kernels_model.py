"""The quantized kernels on the real default model (SmolLM2-135M-Instruct, Q4_1 layers and a Q8_0
embedding/lm_head from the packaged GGUF): weights packed at load, the fused decode step running the
model, and its two-byte-activation products agreeing with float32 activations
(``TOKENOPS_QUANT_EXACT``, the PyTorch forward) on the next token at every position of a greedy
continuation, teacher-forced. (8-bit activations alone, llama.cpp's, moved these logits by ~3% of
the largest and flipped near ties: "What is the capital of France?" began "L'Étoile" instead of
"The capital of France is Paris".)"""

from __future__ import annotations

import pytest
import torch

from tokenops.engine.kernels import quant_kernels

PROMPT_IDS = [1, 9690, 198, 2683, 253, 1345, 2838, 563, 253, 9401, 638, 3680, 288, 5400, 30, 2, 198]
NUM_TOKENS = 32


def _model_path() -> str:
    from tokenops.engine.models.default_model import SMOLLM2_INSTALL, smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip(f"the default model's package is not installed ({SMOLLM2_INSTALL})")
    return str(path)


def _runner(monkeypatch: pytest.MonkeyPatch, exact: bool):
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    monkeypatch.setenv("TOKENOPS_QUANT_EXACT", "1" if exact else "0")
    # two-byte activations: the comparison's 1e-2 is the float32 path's; one byte is llama.cpp's
    # rounding and flips near-tied tokens (tests/engine/test_quant_act_bytes.py checks it)
    return ModelRunner(EngineConfig(model=_model_path(), device="cpu", block_size=16, kv_cache_tokens=256,
                                    torch_threads=1, quant_act_bytes=2))


@torch.no_grad()
def test_real_model_fused_8bit_step_agrees_with_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.kernels.quantized_linear import QuantizedWeight

    if quant_kernels.get_kernels() is None or not quant_kernels.get_kernels().has_avx2:
        pytest.skip("the quantized kernels need a C compiler and AVX2")
    exact = _runner(monkeypatch, exact=True)
    assert exact.fused_decode is None  # float32 activations: the PyTorch forward
    table = list(range(4))
    seq = list(PROMPT_IDS)
    logits = exact.execute([ChunkInput(seq, 0, table)])[0]
    for _ in range(NUM_TOKENS):  # the float32 path's greedy continuation
        seq.append(int(logits.argmax()))
        logits = exact.execute([ChunkInput(seq[-1:], len(seq) - 1, table)])[0]
    ref = exact.execute([ChunkInput(seq, 0, table, num_logits=NUM_TOKENS + 1)])
    del exact

    fast = _runner(monkeypatch, exact=False)
    weights = {id(m): m for m in fast.model.modules() if isinstance(m, QuantizedWeight)}.values()
    assert weights and all(w.packed is not None for w in weights)  # Q4_1 and Q8_0 all packed at load
    assert fast.fused_decode is not None
    ours = fast.execute([ChunkInput(seq, 0, table, num_logits=NUM_TOKENS + 1)])
    assert fast.num_fused_steps == 1
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    err = ((ours - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()
    print(f"top-1 agreement {agree:.3f}, largest logit difference {err:.3f} of the largest logit")
    assert agree == 1.0 and err < 1e-2, (agree, err)
