"""``min_p`` (vLLM's and llama.cpp's relative probability floor) through a real ``tokenops serve`` on the
default model, driven by the openai SDK. It was added as one entry of the sampling-field registry
(tokenops/sampling_fields.py): schema, typed field, field-table row, cache key and the engine's argument
all follow from it (issue 53: a new sampling field in at most three files).

``min_p: 0.99`` keeps only the likeliest token (short of a near tie), so even at temperature 1.2 every
seed gives the greedy answer; without it the same seeds give different answers; out of [0, 1) it is a
400 naming ``min_p`` (the bundled engine's range; 1 would be greedy decoding)."""

from __future__ import annotations

import openai
import pytest

from tests.real_model import MODEL, SERVE_ENV, serve_args
from tokenops.testing_serve import ServeProcess

PROMPT = [{"role": "user", "content": "Write one sentence about the sea."}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("min_p"), args=serve_args(), env=SERVE_ENV, store=False) as srv:
        yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)


def _answer(client, **kw) -> str:
    got = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=16, **kw)
    return got.choices[0].message.content or ""


def test_min_p_one_keeps_only_the_likeliest_token(client):
    greedy = _answer(client, temperature=0)
    floored = {_answer(client, temperature=1.2, seed=seed, extra_body={"min_p": 0.99}) for seed in range(4)}
    assert floored == {greedy}
    free = {_answer(client, temperature=1.2, seed=seed, extra_body={"min_p": 0.0}) for seed in range(4)}
    assert len(free) > 1, "without the floor, the seeds sample different answers"


@pytest.mark.parametrize("value", [1.0, -0.1, "high"])
def test_min_p_out_of_range_is_a_400_naming_it(client, value):
    with pytest.raises(openai.BadRequestError) as err:
        _answer(client, extra_body={"min_p": value})
    assert err.value.body["param"] == "min_p", err.value.body
