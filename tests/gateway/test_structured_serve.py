"""Structured outputs and tool calling on the bundled engine, through a real
``tokenops serve`` (the demo model) driven by the openai SDK and LangChain.

The demo model writes word salad: everything that validates here does so because
decoding is grammar-constrained, not because the model knows JSON.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from tokenops.testing_serve import ServeProcess

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                                                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                  "required": ["city", "unit", "days"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "languages": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "languages"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("structured"), store=False) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def _ask(client, model, content="What is the weather in Paris this week?", **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=kw.pop("max_tokens", 64), **kw)


def test_named_tool_choice_returns_a_call_whose_arguments_validate(client, model):
    r = _ask(client, model, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


def test_pydantic_function_tool_with_defs_and_recursion_is_a_valid_forced_call(client, model):
    """``openai.pydantic_function_tool`` of a model with a nested model (``$defs``) and a
    recursive one (a ``$ref`` back to itself): the forced call's arguments parse back
    into the pydantic model."""
    from pydantic import BaseModel

    class Address(BaseModel):
        city: str
        zip_code: str

    class Folder(BaseModel):
        name: str
        subfolders: list["Folder"]

    class FileAway(BaseModel):
        """Store a letter for a person at an address, in a folder."""
        person: str
        address: Address
        folder: Folder

    tool = openai.pydantic_function_tool(FileAway)
    assert "$defs" in tool["function"]["parameters"]
    for choice in ({"type": "function", "function": {"name": "FileAway"}}, "required"):
        r = _ask(client, model, "File the letter to Ada in Paris.", tools=[tool], tool_choice=choice, max_tokens=200)
        [call] = r.choices[0].message.tool_calls
        assert call.function.name == "FileAway"
        FileAway.model_validate_json(call.function.arguments)  # raises when the $refs were not followed


def test_instructor_tools_mode_with_a_nested_model(client, model):
    """instructor's TOOLS mode forces a call of a tool whose parameters are the model's schema
    (``$defs`` for the nested model); the reply validates into the pydantic model."""
    instructor = pytest.importorskip("instructor")
    from pydantic import BaseModel

    class Address(BaseModel):
        city: str
        country: str

    class Person(BaseModel):
        name: str
        age: int
        home: Address

    assert "$defs" in Person.model_json_schema()
    patched = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    person = patched.chat.completions.create(model=model, response_model=Person, max_retries=0, max_tokens=120,
                                             messages=[{"role": "user", "content": "Ada, 36, lives in Paris, France."}])
    assert isinstance(person, Person) and isinstance(person.home, Address)


def test_required_tool_choice_streams_openai_tool_call_deltas(client, model):
    stream = _ask(client, model, tools=TOOLS, tool_choice="required", stream=True,
                  stream_options={"include_usage": True})
    calls: dict[int, dict] = {}
    finish, num_pieces, usage = None, 0, None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not delta.content  # a forced call has no content
        for piece in delta.tool_calls or []:
            num_pieces += 1
            call = calls.setdefault(piece.index, {"id": piece.id, "name": piece.function.name, "arguments": ""})
            if piece.id is not None:
                assert piece.id == call["id"] and piece.function.name == call["name"]
            call["arguments"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0] and num_pieces >= 2
    call = calls[0]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call["name"]]
    jsonschema.validate(json.loads(call["arguments"]), params)
    assert usage.completion_tokens > 0


def test_tools_reach_the_chat_template_unless_tool_choice_is_none(client, model):
    plain = _ask(client, model, max_tokens=1).usage.prompt_tokens
    with_tools = _ask(client, model, max_tokens=1, tools=TOOLS).usage.prompt_tokens
    none = _ask(client, model, max_tokens=1, tools=TOOLS, tool_choice="none").usage.prompt_tokens
    assert with_tools > plain + 50 and none == plain


def test_multi_turn_with_an_assistant_call_and_a_tool_result(client, model):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    first = client.chat.completions.create(model=model, messages=messages[:1], tools=TOOLS, max_tokens=1)
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > first.usage.prompt_tokens + 20  # the call and its result were rendered


def test_json_schema_response_validates_for_twenty_prompts(client, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    prompts = [f"Describe person number {i} in JSON." for i in range(20)]
    with ThreadPoolExecutor(8) as pool:  # sent together: they share the engine's batches
        replies = list(pool.map(lambda p: _ask(client, model, p, response_format=fmt, max_tokens=48), prompts))
    for r in replies:  # default sampling (temperature 1): the hard case for a word-salad model
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
        assert r.choices[0].finish_reason == "stop"


def test_auto_tools_beside_a_json_schema_give_calls_or_valid_json(client, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for i in range(3):
        choice = _ask(client, model, f"Person {i}?", tools=TOOLS, response_format=fmt, max_tokens=48).choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
                jsonschema.validate(json.loads(call.function.arguments), params)
        else:
            jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object_response_is_an_object(client, model):
    r = _ask(client, model, response_format={"type": "json_object"}, max_tokens=48, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("kwargs, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": 3}}}]},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
])
def test_bad_schemas_and_tool_choices_are_400_before_generation(client, model, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, model, **kwargs)
    assert e.value.body["param"] == param and e.value.status_code == 400


# -- LangChain (langchain-openai) -------------------------------------------------------


@pytest.fixture(scope="module")
def chat(server, model):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=model, base_url=server.base_url, api_key="unused", max_tokens=64, max_retries=0)


def test_langchain_bind_tools_returns_tool_calls(chat):
    from langchain_core.tools import tool

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    msg = chat.bind_tools([multiply], tool_choice="multiply").invoke("What is 6 times 7?")
    [call] = msg.tool_calls
    assert call["name"] == "multiply" and isinstance(call["args"]["a"], int) and isinstance(call["args"]["b"], int)
    assert multiply.invoke(call["args"]) == call["args"]["a"] * call["args"]["b"]


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_langchain_with_structured_output(chat, method):
    from pydantic import BaseModel

    class Person(BaseModel):
        """A person."""

        name: str
        age: int

    if method == "json_mode":  # JSON mode promises an object, not the schema: ask for a dict
        out = chat.with_structured_output(None, method="json_mode").invoke("Describe a person as JSON.")
        assert isinstance(out, dict)
        return
    out = chat.with_structured_output(Person, method=method).invoke("Describe a person.")
    assert isinstance(out, Person) and isinstance(out.age, int)
