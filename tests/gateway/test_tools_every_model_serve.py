"""Issue 52 parts 1 and 2: tool calls on a model whose chat template renders no tools (the default
SmolLM2-135M-Instruct), through a real ``tokenops serve`` driven by the openai and anthropic SDKs.

The model gets the generic tool format (tokenops/backends/tool_format.py): its card and the server
log say so; a tool makes the prompt longer; with ``tool_choice`` auto an obviously needed tool is
called with valid arguments and a greeting gets text; forced calls with parallel calls allowed
(chat ``required``, Anthropic ``any``) come back complete and schema-valid, never raw markup.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from tests.real_model import MODEL, SERVE_ENV, serve_args
from tokenops.testing_serve import ServeProcess

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": WEATHER_PARAMS},
}
ADD_PARAMS = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": ADD_PARAMS}}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "add": ADD_PARAMS}
CITIES = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Berlin", "Madrid", "Sydney", "Nairobi"]
#: Twenty prompts for the forced parallel loops (two cities, or a city and a sum).
PROMPTS = [f"Weather in {a} and in {b}?" for a, b in zip(CITIES, CITIES[1:] + CITIES[:1])] + [
    f"What is {n} plus {n + 7}, and is it sunny in {c}?" for n, c in zip(range(3, 13), CITIES)
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("tools-every-model"), args=serve_args(), env=SERVE_ENV, store=False) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=600)


def _check_call(name: str, arguments: str) -> None:
    assert "<tool_call>" not in arguments and "_arguments" not in arguments
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_the_model_card_and_the_log_name_the_generic_format(srv):
    card = httpx.get(f"{srv.base_url}/models/{MODEL}", timeout=30).json()
    assert card["tool_format"] == "generic" and card["tool_call_parser"] == "generic"
    assert "tool format: generic" in srv.log()


def test_a_tool_lengthens_the_prompt(client):
    messages = [{"role": "user", "content": "Hi"}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)
    tooled = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=1, temperature=0)
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 20


def test_auto_calls_the_obvious_tool_and_answers_a_greeting_in_text(client):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What's the weather in Paris?"}], tools=[WEATHER, ADD],
        temperature=0, max_tokens=64)
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and out.choices[0].finish_reason == "tool_calls"
    _check_call(call.function.name, call.function.arguments)
    assert json.loads(call.function.arguments)["city"] == "Paris"
    hello = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello! How are you?"}], tools=[WEATHER, ADD],
        temperature=0, max_tokens=32)
    message = hello.choices[0].message
    assert not message.tool_calls and message.content and "<tool_call>" not in message.content


def test_a_streamed_auto_call_arrives_as_deltas(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What's the weather in Paris?"}], tools=[WEATHER],
        temperature=0, max_tokens=64, stream=True)
    name, arguments, content = "", "", ""
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            name += delta.function.name or ""
            arguments += delta.function.arguments or ""
        content += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    assert name == "get_weather" and not content.strip()
    _check_call(name, arguments)


def test_a_tool_result_is_answered_in_text(client):
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 22 degrees Celsius"},
    ]
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], temperature=0, max_tokens=48)
    assert not out.choices[0].message.tool_calls and out.choices[0].message.content


def test_the_reserved_name_is_a_400_naming_why(client):
    tool = {"type": "function", "function": {"name": "text", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError, match="generic format"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[tool], max_tokens=8)


def _chat_required(client, prompts: list[str]) -> None:
    for prompt in prompts:
        out = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], tools=[WEATHER, ADD], tool_choice="required",
            parallel_tool_calls=True, temperature=0, max_tokens=96)
        choice = out.choices[0]
        assert choice.message.tool_calls and not (choice.message.content or "").strip(), prompt
        for call in choice.message.tool_calls:
            _check_call(call.function.name, call.function.arguments)


def _anthropic_any(srv, prompts: list[str]) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in (WEATHER, ADD)]
    for prompt in prompts:
        out = client.messages.create(model=MODEL, max_tokens=96, messages=[{"role": "user", "content": prompt}],
                                     tools=tools, tool_choice={"type": "any"})
        uses = [b for b in out.content if b.type == "tool_use"]
        assert uses and out.stop_reason == "tool_use", prompt
        assert not any(b.type == "text" and "<tool_call>" in b.text for b in out.content)
        for block in uses:
            jsonschema.validate(block.input, SCHEMAS[block.name])


def test_forced_parallel_calls_end_complete_chat(client):
    _chat_required(client, PROMPTS[:3])


def test_forced_parallel_calls_end_complete_anthropic(srv):
    _anthropic_any(srv, PROMPTS[:3])


def test_responses_api_calls_the_tool(client):
    out = client.responses.create(
        model=MODEL, input="What's the weather in Paris?", temperature=0, max_output_tokens=64,
        tools=[{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
                "parameters": WEATHER_PARAMS}])
    [call] = [o for o in out.output if o.type == "function_call"]
    assert call.name == "get_weather"
    _check_call(call.name, call.arguments)


@pytest.mark.slow
def test_twenty_forced_parallel_turns_end_complete_chat(client):
    _chat_required(client, PROMPTS)


@pytest.mark.slow
def test_twenty_forced_parallel_turns_end_complete_anthropic(srv):
    _anthropic_any(srv, PROMPTS)


@pytest.mark.slow
def test_openai_agents_calls_a_tool_then_answers_from_its_result(srv):
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return f"Sunny, 22 degrees Celsius in {city}"

    model = OpenAIChatCompletionsModel(MODEL, openai.AsyncOpenAI(base_url=srv.base_url, api_key="unused", max_retries=0))
    agent = Agent(name="weather", model=model, tools=[get_weather],
                  model_settings=ModelSettings(temperature=0, max_tokens=64))
    result = Runner.run_sync(agent, "What's the weather in Paris?", max_turns=4)
    assert seen == ["Paris"]
    assert isinstance(result.final_output, str) and result.final_output.strip()
