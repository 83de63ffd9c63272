"""A model whose architecture the engine cannot load fails alone and says why, through a
running ``tokenops serve``: a one-line log, ``/ready`` 200 listing the failure while
the other model serves, and an OpenAI error naming the cause for requests to it."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.openai_upstream import Upstream
from tokenops.testing_serve import ServeProcess


def tiny_unsupported(path) -> str:
    """A real GPT-2 folder (random weights, transformers' own save_pretrained): an architecture
    the engine does not run."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=32, n_layer=1, n_head=2, n_positions=128)).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The failed GPT-2 beside a model that serves (an OpenAI-compatible upstream: fast to start)."""
    gpt2 = tiny_unsupported(tmp_path_factory.mktemp("gpt2"))
    with Upstream() as up:
        config = (f'[[models]]\nname = "other"\nbackend = "openai"\nurl = "{up.url}"\n\n'
                  f'[[models]]\nname = "gpt2"\nbackend = "local"\npath = "{gpt2}"\n')
        with ServeProcess(tmp_path_factory.mktemp("failed"), config=config, store=False) as srv:
            yield srv, openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def test_ready_lists_the_failed_model_while_the_other_serves(served):
    srv, client = served
    r = httpx.get(srv.url + "/ready")
    assert r.status_code == 200
    body = r.json()
    assert body["ready"] is True and body["degraded"] is True
    assert list(body["failed"]) == ["gpt2"] and "unsupported architecture GPT2LMHeadModel" in body["failed"]["gpt2"]
    assert body["replicas"] == {"other#0": True, "gpt2#0": False}
    assert body["failed_replicas"] == {"gpt2#0": body["failed"]["gpt2"]}
    lines = [line for line in srv.log().splitlines() if "gpt2" in line and "failed to load" in line]
    assert len(lines) == 1 and "GPT2LMHeadModel" in lines[0]
    card = client.models.retrieve("gpt2")
    assert card.status == "failed" and "GPT2LMHeadModel" in card.error


def test_requests_to_the_failed_model_name_the_cause(served):
    srv, client = served
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="gpt2", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, stream=stream)
        assert e.value.status_code == 503 and e.value.code == "model_load_failed"
        assert "failed to load" in e.value.message and "GPT2LMHeadModel" in e.value.message
        assert "still loading" not in e.value.message
    got = client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
    assert got.choices[0].message.content == "echo: hi"


@pytest.mark.slow
def test_bundled_engine_keeps_serving_beside_a_failed_model(tmp_path):
    gpt2 = tiny_unsupported(tmp_path / "gpt2")
    config = ('[[models]]\nname = "demo"\nbackend = "local"\n\n'
              f'[[models]]\nname = "gpt2"\nbackend = "local"\npath = "{gpt2}"\n')
    with ServeProcess(tmp_path / "srv", config=config, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        assert httpx.get(srv.url + "/ready").json()["failed"].keys() == {"gpt2"}
        got = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert got.choices[0].finish_reason in ("stop", "length") and got.usage.completion_tokens >= 1
        with pytest.raises(openai.BadRequestError, match="does not serve embeddings"):
            client.embeddings.create(model="demo", input="hi")
