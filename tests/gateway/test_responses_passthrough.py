"""``/v1/responses`` in front of OpenAI-compatible upstreams, through a running ``tokenops serve``:
an upstream that serves the Responses API gets the request as the client wrote it (the
conversation resolved by the gateway, every field passed through), one that does not
(404 there) gets it translated to chat completions. Upstreams: openai_upstream.py."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.openai_upstream import MODEL_ID, Upstream
from tokenops.testing_serve import ServeProcess

WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with Upstream(responses=True) as native, Upstream() as chat_only:
        config = (f'[[models]]\nname = "native"\nbackend = "openai"\nurl = "{native.url}"\n'
                  "cost_input_per_1m = 2.0\ncost_output_per_1m = 10.0\n\n"
                  f'[[models]]\nname = "chat-only"\nbackend = "openai"\nurl = "{chat_only.url}"\n')
        with ServeProcess(tmp_path_factory.mktemp("responses-up"), config=config, store=False) as srv:
            yield native, chat_only, openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def test_an_upstream_serving_responses_gets_the_request_as_written(served):
    native, _, client = served
    first = client.responses.create(model="native", input="hello", extra_body={"vllm_extension": {"x": 1}},
                                    max_output_tokens=32, include=["reasoning.encrypted_content"])
    assert first.output_text == "upstream: hello" and first.model == "native" and first.id != "resp_upstream"
    assert first.usage.input_tokens == 13 and first.usage.output_tokens == 7
    sent = native.bodies[-1]
    assert sent["model"] == MODEL_ID and sent["store"] is False and sent["vllm_extension"] == {"x": 1}
    assert sent["include"] == ["reasoning.encrypted_content"] and "previous_response_id" not in sent

    second = client.responses.create(model="native", input="again", previous_response_id=first.id, max_output_tokens=32)
    sent = native.bodies[-1]
    assert [i.get("role") for i in sent["input"]] == ["user", "assistant", "user"] and "previous_response_id" not in sent
    assert sent["input"][1]["content"][0]["text"] == "upstream: hello" and second.output_text == "upstream: again"


def test_what_only_the_responses_api_expresses_passes_through(served):
    """Built-in tools and image parts have no chat form: the bundled engine refuses them
    (test_responses_serve.py); an upstream serving /v1/responses gets them as sent."""
    native, _, client = served
    image = {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "low"}
    r = client.responses.create(model="native", tools=[{"type": "web_search"}], max_output_tokens=8,
                                input=[{"role": "user", "content": [{"type": "input_text", "text": "what is it"}, image]}])
    sent = native.bodies[-1]
    assert sent["tools"] == [{"type": "web_search"}] and sent["input"][0]["content"][1] == image
    assert r.output[0].type == "function_call"  # the fake upstream calls the first tool it is given


def test_an_upstream_serving_responses_streams_reasoning_text_and_calls(served):
    _, _, client = served
    events = list(client.responses.create(model="native", input="think about 6 times 7", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    final = events[-1].response
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "6 times 7 is 42." and final.usage.output_tokens_details.reasoning_tokens == 3

    events = list(client.responses.create(model="native", input="weather?", tools=[WEATHER], stream=True))
    [call] = events[-1].response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.arguments == '{"city": "Paris"}'
    assert call.call_id == "call_up_1"


def test_an_upstream_without_responses_gets_chat_completions(served):
    _, chat_only, client = served
    r = client.responses.create(model="chat-only", instructions="Be brief.", input="hello", max_output_tokens=16)
    assert r.output_text == "echo: hello"
    sent = chat_only.bodies[-1]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    assert sent["max_tokens"] == 16 and "input" not in sent
    stream = list(client.responses.create(model="chat-only", input="weather?", tools=[WEATHER], stream=True))
    calls = [i for i in stream[-1].response.output if i.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather", "get_time"]  # the fake upstream's two calls
    assert chat_only.bodies[-1]["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER["parameters"]}}]
    client.responses.create(model="chat-only", max_output_tokens=8, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is it"}, {"type": "input_image", "image_url": "https://example.com/a.png"}]}])
    assert chat_only.bodies[-1]["messages"][0]["content"] == [  # chat's own image part
        {"type": "text", "text": "what is it"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "auto"}}]


def test_what_chat_cannot_carry_is_a_400_for_a_chat_only_upstream(served):
    _, _, client = served
    for _ in range(2):  # learning that the upstream has no /v1/responses, then knowing it
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="chat-only", input="x", tools=[{"type": "web_search"}], max_output_tokens=4)
        assert e.value.body["param"] == "tools[0].type" and "web_search" in e.value.body["message"]
