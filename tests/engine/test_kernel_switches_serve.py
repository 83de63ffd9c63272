"""The native kernels' switches as engine settings, through ``tokenops serve`` and the openai client
(issue 53 part 3): a model's ``engine = { quant_exact = true }`` in tokenops.toml keeps its GGUF
products on float32 activations (the fused step, which multiplies rounded ones, declines: the
PyTorch forward runs), and the field wins over its environment default (``TOKENOPS_QUANT_EXACT``),
which is read once, when the config is made."""

from __future__ import annotations

import httpx
import pytest
from tiny_gguf import write_tiny_gguf
from tokenops.testing_serve import ServeProcess

PROMPT = "the cat sat on the"


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("switches") / "tiny-llama"
    folder.mkdir()
    return write_tiny_gguf(folder / "tiny-llama.gguf", "llama", "Q4_0", seed=7)


def _served(tmp_path, gguf, engine: str, env: dict[str, str]) -> tuple[str, dict]:
    import openai

    config = f'[engine]\ntorch_threads = 1\n\n[[models]]\nname = "tiny"\npath = "{gguf}"\nengine = {engine}\n'
    with ServeProcess(tmp_path, config=config, env=env, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0).choices[0].text
        stats = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers, timeout=60).json()["engines"]["tiny#0"]
    return text, stats


def test_quant_exact_is_a_model_setting_that_beats_the_environment(tmp_path, gguf):
    text, stats = _served(tmp_path / "exact", gguf, "{ quant_exact = true }", {"TOKENOPS_QUANT_EXACT": "0"})
    assert stats["weight_format"].startswith("gguf Q4_0") and stats["forward"] == "torch"
    rounded_text, rounded = _served(
        tmp_path / "rounded", gguf, "{ quant_exact = false }", {"TOKENOPS_QUANT_EXACT": "1"}
    )
    assert rounded["forward"] == "fused" and rounded["fused_decode_steps"] > 0
    assert isinstance(text, str) and isinstance(rounded_text, str)


def test_a_bad_switch_is_a_one_line_config_error(tmp_path, gguf):
    config = f'[[models]]\nname = "tiny"\npath = "{gguf}"\nengine = {{ quant_amx = "maybe" }}\n'
    with (
        pytest.raises(AssertionError, match="quant_amx must be true or false"),  # serve exits, saying why
        ServeProcess(tmp_path, config=config, store=False, ready_timeout_s=120),
    ):
        pass
