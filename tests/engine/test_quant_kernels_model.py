"""The quantized kernels on the real default model (SmolLM2-135M-Instruct, Q4_1 layers and a Q8_0
embedding/lm_head from the packaged GGUF): the weights are packed at load, and greedy decoding with
8-bit activations gives the tokens that float32 activations (``TOKENOPS_QUANT_EXACT``) give."""

from __future__ import annotations

import pytest

from tokenops.engine import quant_kernels

PROMPT = ("<|im_start|>user\nWrite a short story about a robot who learns to paint.<|im_end|>\n"
          "<|im_start|>assistant\n")
NUM_TOKENS = 24


def _model_path() -> str:
    from tokenops.engine.default_model import SMOLLM2_INSTALL, smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip(f"the default model's package is not installed ({SMOLLM2_INSTALL})")
    return str(path)


def test_real_model_greedy_tokens_match_float32_activations(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenops.engine.config import EngineConfig
    from tokenops.engine.engine import LLMEngine
    from tokenops.engine.quantized_linear import QuantizedWeight
    from tokenops.engine.sampling import SamplingParams

    if quant_kernels.get_kernels() is None:
        pytest.skip("no C compiler: the kernels cannot be built")
    engine = LLMEngine(EngineConfig(model=_model_path(), torch_threads=1, kv_cache_tokens=1024,
                                    enable_prefix_caching=False))
    weights = {id(m): m for m in engine.runner.model.modules() if isinstance(m, QuantizedWeight)}.values()
    assert weights and all(w.packed is not None for w in weights)  # Q4_1 and Q8_0 all packed at load
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    fast = engine.generate([PROMPT], params)[0].outputs[0].token_ids
    monkeypatch.setenv("TOKENOPS_QUANT_EXACT", "1")
    exact = engine.generate([PROMPT], params)[0].outputs[0].token_ids
    assert len(fast) == NUM_TOKENS and fast == exact
