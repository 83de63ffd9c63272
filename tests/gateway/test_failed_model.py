"""A model whose architecture the engine cannot load fails alone and says why, through a
running ``tokenops serve``: a one-line log, ``/ready`` 200 listing the failure while
the other model serves, and an OpenAI error naming the cause for requests to it."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.openai_upstream import Upstream
from tokenops.testing_serve import ServeProcess


def tiny_gemma(path) -> str:
    """A real Gemma checkpoint folder (random weights, transformers' own save_pretrained)."""
    import torch
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(0)
    config = GemmaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128)
    GemmaForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The failed Gemma beside a model that serves (an OpenAI-compatible upstream: fast to start)."""
    gemma = tiny_gemma(tmp_path_factory.mktemp("gemma"))
    with Upstream() as up:
        config = (f'[[models]]\nname = "other"\nbackend = "openai"\nurl = "{up.url}"\n\n'
                  f'[[models]]\nname = "gemma"\nbackend = "local"\npath = "{gemma}"\n')
        with ServeProcess(tmp_path_factory.mktemp("failed"), config=config, store=False) as srv:
            yield srv, openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def test_ready_lists_the_failed_model_while_the_other_serves(served):
    srv, client = served
    r = httpx.get(srv.url + "/ready")
    assert r.status_code == 200
    body = r.json()
    assert body["ready"] is True and body["degraded"] is True
    assert list(body["failed"]) == ["gemma"] and "unsupported architecture GemmaForCausalLM" in body["failed"]["gemma"]
    assert body["replicas"] == {"other#0": True, "gemma#0": False}
    assert body["failed_replicas"] == {"gemma#0": body["failed"]["gemma"]}
    lines = [line for line in srv.log().splitlines() if "gemma" in line and "failed to load" in line]
    assert len(lines) == 1 and "GemmaForCausalLM" in lines[0]
    card = client.models.retrieve("gemma")
    assert card.status == "failed" and "GemmaForCausalLM" in card.error


def test_requests_to_the_failed_model_name_the_cause(served):
    srv, client = served
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, stream=stream)
        assert e.value.status_code == 503 and e.value.code == "model_load_failed"
        assert "failed to load" in e.value.message and "GemmaForCausalLM" in e.value.message
        assert "still loading" not in e.value.message
    got = client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
    assert got.choices[0].message.content == "echo: hi"


@pytest.mark.slow
def test_bundled_engine_keeps_serving_beside_a_failed_model(tmp_path):
    gemma = tiny_gemma(tmp_path / "gemma")
    config = ('[[models]]\nname = "demo"\nbackend = "local"\n\n'
              f'[[models]]\nname = "gemma"\nbackend = "local"\npath = "{gemma}"\n')
    with ServeProcess(tmp_path / "srv", config=config, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        assert httpx.get(srv.url + "/ready").json()["failed"].keys() == {"gemma"}
        got = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert got.choices[0].finish_reason in ("stop", "length") and got.usage.completion_tokens >= 1
        with pytest.raises(openai.BadRequestError, match="does not serve embeddings"):
            client.embeddings.create(model="demo", input="hi")
