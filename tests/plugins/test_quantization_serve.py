"""int8 weights through a real ``tokenops serve`` (the documented ``[plugins.quantization]`` setting):
prompt chunks take the dequantize path, single-row decode steps the native int8 kernel, and the
greedy answer is reproducible."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.serve_configs import config, local_model, section
from tokenops.testing_serve import ServeProcess

TARGET = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"
pytestmark = pytest.mark.skipif(not (TARGET / "config.json").is_file(), reason="demo target not trained")
CONFIG = config(local_model("target", TARGET), section("plugins.quantization", weights="int8"))


def test_int8_weights_serve_greedy_answers(tmp_path):
    with ServeProcess(tmp_path, config=CONFIG, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        ask = dict(model="target", max_tokens=16, temperature=0,
                   messages=[{"role": "user", "content": "Name three colours of the sea."}])
        first = client.chat.completions.create(**ask)
        again = client.chat.completions.create(**ask)
        assert first.choices[0].message.content
        assert first.usage.completion_tokens == 16 or first.choices[0].finish_reason == "stop"
        assert again.choices[0].message.content == first.choices[0].message.content
