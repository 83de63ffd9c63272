"""The embedded default model through a real ``tokenops serve`` with no configuration at all:
SmolLM2-135M-Instruct from the packaged GGUF answers a real question (issue 34's acceptance)."""

from __future__ import annotations

import httpx
import pytest

from tokenops.testing_serve import ServeProcess

#: Clears the suite's toy default (tests/conftest.py), so serve meets what a new user meets.
REAL_DEFAULT_ENV = {"TOKENOPS_DEFAULT_MODEL": ""}
MODEL = "smollm2-135m-instruct"


def _require_smollm2() -> None:
    from tokenops.engine.default_model import SMOLLM2_INSTALL, smollm2_path

    if smollm2_path() is None:
        pytest.skip(f"the default model's package is not installed ({SMOLLM2_INSTALL})")


def test_default_serve_answers_capital_of_france(tmp_path):
    _require_smollm2()
    import openai

    with ServeProcess(tmp_path, env=REAL_DEFAULT_ENV) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused-on-loopback")
        assert client.models.list().data[0].id == MODEL
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24, temperature=0)
        assert "Paris" in reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop"
        engine = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=30).json()["engines"]
        stats = engine[f"{MODEL}#0"]
        # the GGUF's blocks are what the engine multiplies by: Q4_1 layers and the Q8_0 embedding
        assert stats["weight_format"].startswith("gguf Q4_1x210/Q8_0x1") and stats["forward"] == "fused"
        assert stats["panel_dtype"] == "gguf" and stats["fused_decode_steps"] > 0  # the quantized kernels' step
