"""``--model NAME=URL`` and ``[[models]] served_model``: the gateway serves the upstream's
model under NAME and sends the upstream its own id, through a running ``tokenops serve``
in front of an upstream whose id differs (a real HTTP server, 404 for other ids, as vLLM)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.openai_upstream import MODEL_ID, Upstream
from tests.serve_configs import config as serve_config, openai_model
from tokenops.testing_serve import ServeProcess, free_port

DOCS = Path(__file__).resolve().parents[2] / "docs" / "serve.md"
HI = [{"role": "user", "content": "hi"}]


def documented_vllm_args(url: str) -> list[str]:
    """The ``--model vllm=...`` example of docs/serve.md, pointed at ``url``."""
    line = next(ln for ln in DOCS.read_text().splitlines() if re.match(r"tokenops serve --model vllm=http", ln))
    argv = shlex.split(line.split("#", 1)[0])[2:]
    assert argv[0] == "--model" and argv[1].startswith("vllm=http://")
    return [argv[0], "vllm=" + url]


def test_documented_model_name_example_maps_to_the_upstream_id(tmp_path):
    late_port = free_port()
    with Upstream() as up:
        args = documented_vllm_args(up.url) + ["--model", f"late=http://127.0.0.1:{late_port}"]
        with ServeProcess(tmp_path, args=args, store=False) as srv:
            client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
            got = client.chat.completions.create(model="vllm", messages=HI)
            assert got.model == "vllm" and got.choices[0].message.content == "echo: hi"
            assert up.bodies[-1]["model"] == MODEL_ID
            cards = {m.id: m for m in client.models.list().data}
            assert cards["vllm"].root == MODEL_ID and cards["vllm"].max_model_len == 4096
            # an upstream that was down when the gateway started is asked on the first request
            with Upstream(port=late_port) as late:
                streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                    model="late", messages=HI, stream=True) if c.choices)
                assert streamed.strip() == "echo: hi" and late.bodies[-1]["model"] == MODEL_ID


def test_served_model_in_the_config_file(tmp_path):
    with Upstream() as up:
        config = serve_config(
            openai_model("pinned", up.url, served_model=MODEL_ID),
            openai_model("wrong", up.url, served_model="not-there"),
        )
        with ServeProcess(tmp_path, config=config, store=False) as srv:
            client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
            assert client.chat.completions.create(model="pinned", messages=HI).model == "pinned"
            assert up.bodies[-1]["model"] == MODEL_ID
            with pytest.raises(openai.NotFoundError, match="`not-there` does not exist"):
                client.chat.completions.create(model="wrong", messages=HI)
            assert up.bodies[-1]["model"] == "not-there"  # configured ids are sent as written
            assert httpx.get(srv.base_url + "/models/pinned").json()["root"] == MODEL_ID


@pytest.mark.parametrize("listed, want", [
    (["gw-name", "other"], "gw-name"),  # the upstream serves the gateway's name itself
    (["org/only-model"], "org/only-model"),  # its only model
    (["a", "b"], "gw-name"),  # several, none named: keep the name (and warn)
])
def test_upstream_id_policy(listed, want, caplog):
    import asyncio

    from tokenops.backends.openai_http import OpenAIBackend
    from tokenops.config import ModelConfig, Settings

    def answer(request):
        return httpx.Response(200, json={"object": "list", "data": [{"id": i, "object": "model"} for i in listed]})

    backend = OpenAIBackend(ModelConfig(name="gw-name", backend="openai", url="http://upstream:1"), Settings())
    backend._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    asyncio.run(backend._learn_models())
    assert backend.upstream_model == want and backend._has_listed_models
    assert ("none named 'gw-name'" in caplog.text) == (want == "gw-name" and "gw-name" not in listed)


def test_upstream_down_then_5xx_is_asked_again():
    import asyncio

    from tokenops.backends.openai_http import OpenAIBackend
    from tokenops.config import ModelConfig, Settings

    answers = iter([httpx.ConnectError("refused"), httpx.Response(503), httpx.Response(200, json={"data": [{"id": "x"}]})])

    def answer(request):
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    backend = OpenAIBackend(ModelConfig(name="n", backend="openai", url="http://upstream:1"), Settings())
    backend._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    for _ in range(2):
        asyncio.run(backend._learn_models())
        assert not backend._has_listed_models and backend.upstream_model == "n"
    asyncio.run(backend._learn_models())
    assert backend._has_listed_models and backend.upstream_model == "x"
