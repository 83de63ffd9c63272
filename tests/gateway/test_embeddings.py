"""``/v1/embeddings`` and ``GET /v1/models/{id}`` through a running ``tokenops serve``,
driven by the openai SDK: the bundled MiniLM (``backend = "embedding"``) and
pass-through to an OpenAI-compatible upstream (a real HTTP server in the test)."""

from __future__ import annotations

import base64
import struct

import httpx
import numpy as np
import openai
import pytest

from tests.gateway.openai_upstream import EMBED_DIM, MODEL_ID, Upstream, _vector
from tokenops.backends.embedding import is_default_available
from tokenops.testing_serve import ServeProcess

pytestmark = pytest.mark.skipif(not is_default_available(), reason="needs the semantic extra (MiniLM)")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with Upstream() as up:
        config = ('[[models]]\nname = "minilm"\nbackend = "embedding"\ncost_input_per_1m = 0.02\n\n'
                  f'[[models]]\nname = "up-embed"\nbackend = "openai"\nurl = "{up.url}"\n\n'
                  '[[models]]\nname = "broken"\nbackend = "embedding"\npath = "/nonexistent/embedder"\n'
                  'engine = { load = "lazy" }\n')
        with ServeProcess(tmp_path_factory.mktemp("embeddings"), config=config) as srv:
            yield up, srv, openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def test_bundled_minilm_embeds_strings_and_lists(served):
    up, srv, client = served
    one = client.embeddings.create(model="minilm", input="A cat sits on the mat.")  # the SDK asks for base64
    assert one.model == "minilm" and len(one.data) == 1 and len(one.data[0].embedding) == 384
    assert np.linalg.norm(one.data[0].embedding) == pytest.approx(1.0, abs=1e-4)
    assert one.usage.prompt_tokens > 5 and one.usage.total_tokens == one.usage.prompt_tokens
    many = client.embeddings.create(model="minilm", input=["A cat is sitting on the mat.", "Stock markets fell sharply.",
                                                            "A cat sits on the mat."], encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2]
    v = np.array([d.embedding for d in many.data])
    assert v[0] @ v[2] > 0.8 > v[1] @ v[2] + 0.3  # a real sentence-embedding model, not noise
    assert np.allclose(v[2], one.data[0].embedding, atol=1e-5)  # base64 and float carry the same vector


def test_float_and_base64_wire_formats(served):
    _, srv, _ = served
    body = {"model": "minilm", "input": "hello world"}
    floats = httpx.post(srv.base_url + "/embeddings", json=body).json()["data"][0]["embedding"]
    b64 = httpx.post(srv.base_url + "/embeddings", json={**body, "encoding_format": "base64"}).json()
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert isinstance(floats, list) and list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats)


@pytest.mark.parametrize("body, param, words", [
    ({"input": [[101, 7592, 102]]}, "input", "token-id"),
    ({"input": "hi", "dimensions": 64}, "dimensions", "384"),
    ({"input": "word " * 400}, "input", "maximum context length is 256"),
    ({"input": ""}, "input", "empty"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format", "float"),
    ({"input": "hi", "extra_body": {"truncate_prompt_tokens": 8}}, "truncate_prompt_tokens", "Unsupported parameter"),
])
def test_bundled_rejects_what_it_cannot_do(served, body, param, words):
    _, srv, client = served
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="minilm", **body)
    assert e.value.status_code == 400 and words in e.value.message and e.value.param == param


def test_embeddings_pass_through_to_upstream(served):
    up, srv, client = served
    got = client.embeddings.create(model="up-embed", input=["one two", "three"], dimensions=EMBED_DIM, user="u1",
                                   extra_body={"truncate_prompt_tokens": 8})
    sent = up.bodies[-1]
    assert sent["model"] == MODEL_ID and sent["input"] == ["one two", "three"]
    assert sent["encoding_format"] == "base64" and sent["dimensions"] == EMBED_DIM and sent["user"] == "u1"
    assert sent["truncate_prompt_tokens"] == 8
    assert got.model == "up-embed" and got.usage.prompt_tokens == 3
    assert [d.embedding for d in got.data] == [pytest.approx(_vector("one two")), pytest.approx(_vector("three"))]


def test_chat_to_an_embedding_model_is_a_clear_400(served):
    _, _, client = served
    with pytest.raises(openai.BadRequestError, match="embedding model: use /v1/embeddings"):
        client.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])


def test_models_retrieve_and_404(served):
    _, srv, client = served
    card = client.models.retrieve("minilm")
    assert card.id == "minilm" and card.object == "model"
    assert client.models.retrieve("up-embed").root == MODEL_ID  # the upstream's own id
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert "no-such-model" in e.value.message and e.value.code == "model_not_found"


def test_embedding_requests_are_recorded_with_cost(served):
    _, srv, client = served
    before = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json()["models"].get("minilm") or {}
    used = client.embeddings.create(model="minilm", input="count my tokens").usage.prompt_tokens
    after = httpx.get(srv.url + "/admin/stats", headers=srv.admin_headers).json()["models"]["minilm"]
    assert after["input_tokens"] - before.get("input_tokens", 0) == used
    assert after["cost_usd"] - before.get("cost_usd", 0.0) == pytest.approx(used * 0.02 / 1e6)


def test_a_lazy_model_that_fails_to_load_is_a_503_naming_its_folder_and_the_others_serve(served):
    _, _, client = served
    for _ in range(2):  # failed, and still failing: not a 500, not a stall
        with pytest.raises(openai.APIStatusError) as info:
            client.embeddings.create(model="broken", input="hello")
        assert info.value.status_code == 503 and "/nonexistent/embedder" in info.value.message
    assert len(client.embeddings.create(model="minilm", input="hello").data[0].embedding) == 384


def test_default_models_list_minilm_loaded_lazily():
    from tokenops.backends.embedding import DEFAULT_EMBEDDING_MODEL, EmbeddingBackend
    from tokenops.backends.registry import default_model_configs
    from tokenops.config import ConfigError, ModelConfig, Settings

    entry = next(m for m in default_model_configs() if m.name == DEFAULT_EMBEDDING_MODEL)
    assert entry.backend == "embedding" and entry.engine == {"load": "lazy"}
    backend = EmbeddingBackend(entry, Settings())
    assert backend.ready and backend._st is None  # listed and routable at once; loads on its first request
    with pytest.raises(ConfigError, match="load = 'soon'"):
        EmbeddingBackend(ModelConfig(name="e", backend="embedding", engine={"load": "soon"}), Settings())


@pytest.mark.slow
def test_plain_tokenops_serve_serves_minilm_embeddings(tmp_path):
    with ServeProcess(tmp_path, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        assert "all-minilm-l6-v2" in {m.id for m in client.models.list().data}
        got = client.embeddings.create(model="all-minilm-l6-v2", input=["first", "second"])
        assert [len(d.embedding) for d in got.data] == [384, 384]
