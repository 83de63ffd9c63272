"""Issue 36's fields through a real ``tokenops serve`` on SmolLM2-135M-Instruct, driven by the openai SDK:
penalties, ``logit_bias``, ``min_tokens`` act; their ranges are 400s naming the field; completions'
``echo`` returns the prompt and its logprobs (lm-eval's exact loglikelihood request included, checked
against transformers on the same weights); images, audio and files sent to the text-only model are 400s."""

from __future__ import annotations

import json
from collections import Counter

import openai
import pytest

from tests.real_model import MODEL, SERVE_ENV, serve_args, smollm2_folder
from tokenops.testing_serve import ServeProcess

QUESTION = [{"role": "user", "content": "List the days of the week, one per line."}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("fields36"), args=serve_args(), env=SERVE_ENV, store=False) as srv:
        yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def hf_model():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_folder()
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(folder))


def _chat(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, **kw)


def test_penalties_and_logit_bias_change_greedy_output(client, hf_model):
    def tokens(**extra):
        got = client.completions.create(model=MODEL, prompt="Monday, Monday, Monday, Monday, Monday,", max_tokens=12,
                                        temperature=0, logprobs=0, extra_body=extra)
        return got.choices[0].logprobs.tokens

    plain = tokens()
    top_count = Counter(plain).most_common(1)[0][1]
    assert top_count >= 6, plain  # " Monday" again and again: something for a penalty to act on
    penalised = tokens(frequency_penalty=2.0, presence_penalty=1.0)
    assert penalised != plain and Counter(penalised).most_common(1)[0][1] < top_count, penalised
    assert tokens(repetition_penalty=3.0)[0] != plain[0]  # the prompt's tokens count too: " Monday" is penalised at once
    # a +100 bias on one token makes it the greedy choice everywhere; -100 on the first token moves it
    forced = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0,
                                       logit_bias={"28": 100}, logprobs=0)
    assert forced.choices[0].logprobs.tokens == [forced.choices[0].logprobs.tokens[0]] * 3
    first = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0,
                                      logprobs=0)
    first_text = first.choices[0].logprobs.tokens[0]
    ids = hf_model[1](first_text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (first_text, ids)
    moved = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0,
                                      logprobs=1, logit_bias={str(ids[0]): -100})
    assert moved.choices[0].logprobs.tokens[0] != first_text


def test_min_tokens_holds_off_the_end(client):
    def count(**extra):
        got = client.completions.create(model=MODEL, prompt="Count: 1, 2, 3,", max_tokens=20, temperature=0,
                                        stop=[","], extra_body=extra)
        return got.usage.completion_tokens, got.choices[0].text

    n, text = count()
    assert n <= 3, text  # " 4" then the stop string
    more, text = count(min_tokens=n + 6)
    assert more >= n + 6 and "," in text, text  # the stop string could not end it before min_tokens


def test_penalties_keep_structured_outputs_valid(client):
    schema = {"type": "object", "properties": {"days": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
              "required": ["days"], "additionalProperties": False}
    got = _chat(client, max_tokens=60, frequency_penalty=1.5, extra_body={"repetition_penalty": 1.3, "min_tokens": 5},
                response_format={"type": "json_schema", "json_schema": {"name": "days", "schema": schema, "strict": True}})
    data = json.loads(got.choices[0].message.content)
    assert isinstance(data["days"], list) and len(data["days"]) <= 3


@pytest.mark.parametrize("extra,param", [
    ({"frequency_penalty": 2.5}, "frequency_penalty"), ({"presence_penalty": -3}, "presence_penalty"),
    ({"logit_bias": {"10": 150}}, "logit_bias"), ({"logit_bias": {"cat": 1}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"),
])
def test_out_of_range_values_are_400s_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=extra.pop("max_tokens", 4),
                                       extra_body=extra)
    assert e.value.param.startswith(param), (e.value.param, e.value.message)


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
])
def test_non_text_parts_are_400s_on_the_text_only_model(client, part):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}])
    assert e.value.param == "messages.0.content.1.type" and f"`{part['type']}`" in e.value.message


def test_echo_scores_the_prompt_as_transformers_does(client, hf_model):
    import torch

    model, tok = hf_model
    prompt = "The capital of France is Paris"
    got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=2, temperature=0)
    choice = got.choices[0]
    ids = tok(prompt)["input_ids"]
    assert choice.text == prompt and choice.finish_reason == "length" and got.usage.completion_tokens == 0
    lp = choice.logprobs
    assert len(lp.token_logprobs) == len(ids) == got.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    for i in range(1, len(ids)):
        # one-byte activations (the default, llama.cpp's rounding) move a logprob by up to ~0.02 here;
        # scoring the wrong position would be off by nats
        assert lp.token_logprobs[i] == pytest.approx(want[i - 1, ids[i]].item(), abs=5e-2)
        assert len(lp.top_logprobs[i]) == 2 and max(lp.top_logprobs[i].values()) >= lp.token_logprobs[i] - 1e-6


def test_lm_eval_request_shape(client, hf_model):
    """What lm-eval's ``local-completions`` sends for a loglikelihood request, parsed as it parses it."""
    import httpx

    _, tok = hf_model
    context, continuation = tok("Question: 2 + 2 =")["input_ids"], tok(" 4", add_special_tokens=False)["input_ids"]
    payload = {"model": MODEL, "prompt": [context + continuation], "temperature": 0, "max_tokens": 1, "logprobs": 1,
               "seed": 1234, "echo": True}
    r = httpx.post(f"{client.base_url}completions", json=payload, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    token_logprobs = choice["logprobs"]["token_logprobs"]
    assert len(token_logprobs) == len(context) + len(continuation) + 1  # the prompt, then the generated token
    scored = token_logprobs[len(context):-1]
    assert len(scored) == len(continuation) and all(isinstance(v, float) and v < 0 for v in scored)
    tops = choice["logprobs"]["top_logprobs"][len(context):-1]
    assert all(len(t) == 1 and max(t.values()) >= v - 1e-6 for t, v in zip(tops, scored))


def test_streamed_echo_sends_the_prompt_first(client):
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3, echo=True,
                                            temperature=0, stream=True))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert texts[0] == "Once upon a time" and len("".join(texts)) > len(texts[0])
