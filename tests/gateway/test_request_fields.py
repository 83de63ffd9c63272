"""Nothing silently dropped: every OpenAI request field acts, passes through, or gets a
400 — checked against the table of tokenops/gateway/core/fields.py, its copy in
docs/serve.md, the request schemas, the openai SDK's own parameter lists, and a
running ``tokenops serve`` (bundled engine and an OpenAI-compatible upstream)."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import openai
import pytest
from tests.gateway.openai_upstream import Upstream
from tokenops.gateway.core.fields import TABLES, declared, markdown
from tokenops.testing_serve import ServeProcess

DOCS = Path(__file__).resolve().parents[2] / "docs" / "serve.md"

#: A value that changes something, for every field the bundled backends reject.
SAMPLES = {
    "functions": [{"name": "f", "parameters": {"type": "object"}}],
    "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"},
    "web_search_options": {},
    "verbosity": "low",
    "store": True,
    "metadata": {"k": "v"},
    "service_tier": "flex",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "x"},
    "safety_identifier": "s",
    "moderation": {"mode": "x"},
    "suffix": "!",
    "best_of": 2,
}
#: Fields the bundled engine acts on that an upstream must get unchanged too.
ACTED = {
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "logit_bias": {"50": 5},
    "repetition_penalty": 1.1,
    "min_tokens": 1,
}
#: Values that change nothing, accepted by the bundled engine.
NEUTRAL = {
    "frequency_penalty": 0,
    "presence_penalty": 0.0,
    "logit_bias": {},
    "store": False,
    "service_tier": "auto",
    "modalities": ["text"],
}


def sdk_fields(kind: str) -> set[str]:
    from openai.types import completion_create_params, embedding_create_params
    from openai.types.chat import completion_create_params as chat_params

    params = {
        "chat": chat_params.CompletionCreateParamsBase,
        "completion": completion_create_params.CompletionCreateParamsBase,
        "embedding": embedding_create_params.EmbeddingCreateParams,
    }[kind]
    return set(typing.get_type_hints(params)) | ({"stream"} if kind != "embedding" else set())


def test_docs_carry_the_generated_tables():
    text = DOCS.read_text()
    found = re.search(r"<!-- fields:begin -->\n(.*?)<!-- fields:end -->", text, re.S)
    assert found, "docs/serve.md lacks the fields tables"
    assert found.group(1) == markdown(), "docs/serve.md is stale: paste `python -m tokenops.gateway.core.fields`"


@pytest.mark.parametrize("kind", list(TABLES))
def test_every_known_field_has_a_row(kind):
    rows = [f.name for f in TABLES[kind]]
    assert len(rows) == len(set(rows)), "a field listed twice"
    missing = (sdk_fields(kind) | declared(kind)) - set(rows)
    assert not missing, f"{kind}: no row for {sorted(missing)} in tokenops/gateway/core/fields.py"


def test_every_rejected_field_has_a_sample():
    rejected = {f.name for rows in TABLES.values() for f in rows if f.is_rejected}
    assert rejected == set(SAMPLES)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with Upstream() as up:
        config = f'[[models]]\nname = "demo"\nbackend = "local"\n\n[[models]]\nname = "up"\nbackend = "openai"\nurl = "{up.url}"\n'
        with ServeProcess(tmp_path_factory.mktemp("fields"), config=config, store=False) as srv:
            yield up, openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def _call(client, kind, model, extra):
    if kind == "chat":
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_body=extra
        )
    return client.completions.create(model=model, prompt="hi", max_tokens=2, extra_body=extra)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_bundled_engine_rejects_what_it_does_not_do(served, kind):
    _, client = served
    rejected = [f.name for f in TABLES[kind] if f.is_rejected] + ["typical_p"]  # typical_p: a llama.cpp field unknown here
    for name in rejected:
        with pytest.raises(openai.BadRequestError) as e:
            _call(client, kind, "demo", {name: SAMPLES.get(name, 0.1)})
        assert e.value.param == name and e.value.code == "unsupported_parameter", name
        assert f"`{name}`" in e.value.message
    neutral = {k: v for k, v in NEUTRAL.items() if k in {f.name for f in TABLES[kind]}}
    neutral["cache"] = False  # the semantic cache's switch: acted on by the gateway, never a 400
    got = _call(client, kind, "demo", neutral)
    assert got.usage.completion_tokens >= 1


def test_upstream_gets_every_field_unchanged(served):
    up, client = served
    kind = "chat"  # the test upstream serves chat; completions share the same pass-through code
    extra = {**SAMPLES, **ACTED, "min_p": 0.1, "top_k": 5, "ignore_eos": True}
    extra = {k: v for k, v in extra.items() if k not in ("echo", "suffix", "best_of")}
    _call(client, kind, "up", {**extra, "cache": False})
    sent = up.bodies[-1]
    for key, value in extra.items():
        assert sent.get(key) == value, key
    assert "cache" not in sent  # the gateway's own switch stays in the gateway


def test_completion_fields_the_engine_rejects_pass_through_to_upstreams(served):
    up, client = served
    got = client.completions.create(
        model="up",
        prompt="Once",
        max_tokens=4,
        echo=True,
        suffix="!",
        best_of=2,
        logit_bias={"50": 1},
        presence_penalty=0.5,
        extra_body={"min_p": 0.1},
    )
    sent = up.bodies[-1]
    assert (sent["echo"], sent["suffix"], sent["best_of"], sent["min_p"]) == (True, "!", 2, 0.1)
    assert sent["logit_bias"] == {"50": 1} and sent["presence_penalty"] == 0.5
    assert got.choices[0].text == "Once and so on!" and got.usage.completion_tokens == 4


def test_non_text_content_parts_pass_through_to_upstreams(served):
    up, client = served
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    ]
    client.chat.completions.create(model="up", max_tokens=2, messages=[{"role": "user", "content": parts}])
    assert up.bodies[-1]["messages"][0]["content"] == parts
    with pytest.raises(openai.BadRequestError) as e:  # the bundled demo model is text-only
        client.chat.completions.create(model="demo", max_tokens=2, messages=[{"role": "user", "content": parts}])
    assert e.value.param == "messages.0.content.1.type" and e.value.code == "unsupported_content_type"
