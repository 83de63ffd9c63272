"""A native tool format through a real ``tokenops serve`` (issue 52): Qwen2.5-Coder-0.5B-Instruct from
the package registry's GGUF (``scripts/fetch_registry_ggufs.py``; skipped when not fetched), whose chat
template renders tools and calls in the Hermes format. Its card and log name ``native`` / ``hermes``;
with ``tool_choice`` auto the model writes its call as a fenced JSON block, which comes back to the
openai SDK as a ``tool_calls`` entry; a request that needs no tool gets text; forced calls with
parallel calls allowed are complete and schema-valid.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from tokenops.testing_serve import ServeProcess

pytestmark = pytest.mark.slow  # a 0.5B model loads and answers in ~2 min on the shared box
GGUF = Path(os.environ.get("TOKENOPS_GGUF_DIR", Path.home() / ".cache" / "tokenops" / "ggufs")) / (
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
)
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                            "parameters": PARAMS}}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    if not GGUF.exists():
        pytest.skip(f"{GGUF} is not fetched (.venv/bin/python scripts/fetch_registry_ggufs.py)")
    with ServeProcess(tmp_path_factory.mktemp("native-tools"), args=["--model", str(GGUF)], store=False,
                      ready_timeout_s=600) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=600)


def test_card_and_log_name_the_native_hermes_format(srv):
    card = httpx.get(f"{srv.base_url}/models/{GGUF.stem}", timeout=30).json()
    assert (card["tool_format"], card["tool_call_parser"]) == ("native", "hermes")
    assert "tool format: generic" not in srv.log()  # the native line is at info level


def test_auto_call_and_text_reply(client):
    out = client.chat.completions.create(
        model=GGUF.stem, messages=[{"role": "user", "content": "What's the weather in Paris?"}], tools=[WEATHER],
        temperature=0, max_tokens=64)
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and out.choices[0].finish_reason == "tool_calls"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not (out.choices[0].message.content or "").strip()


def test_forced_parallel_calls_are_complete(client):
    out = client.chat.completions.create(
        model=GGUF.stem, messages=[{"role": "user", "content": "Weather in Paris and in Rome?"}], tools=[WEATHER],
        tool_choice="required", parallel_tool_calls=True, temperature=0, max_tokens=96)
    calls = out.choices[0].message.tool_calls
    assert calls and all(c.function.name == "get_weather" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), PARAMS)
