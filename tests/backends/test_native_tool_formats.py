"""Native tool formats beyond Hermes (issue 52): a chat template that renders tools keeps them, and
the calls the model writes in its family's format are parsed (tokenops/backends/json_tool_calls.py);
the parser is the one whose format the template renders an earlier call in
(tokenops/backends/tool_format.py ``native_parser_of``).

The templates below are written for these tests and reproduce the tool-relevant shapes of the real
ones: Llama 3.1/3.2/3.3 (tools as JSON in the user turn, a call rendered ``{"name": ..., "parameters":
...}``, one call per turn, results as ``ipython``), Mistral Nemo / 7B v0.3 (``[AVAILABLE_TOOLS]``,
``[TOOL_CALLS][{...}, ...]`` with 9-character ids, ``[TOOL_RESULTS]``), Qwen 2.5 (Hermes
``<tool_call>``), Qwen3-Coder (XML calls no parser reads) and SmolLM2 (no tools at all).
"""

from __future__ import annotations

import json

import pytest
import tokenizers
from tokenops.backends.base import merge_tool_calls
from tokenops.backends.json_tool_calls import mistral_call_id, parse_llama3_calls, parse_mistral_calls
from tokenops.backends.local_structured import plan_request
from tokenops.backends.tool_format import tool_format_of
from tokenops.backends.tool_parsers import get_tool_call_parser
from tokenops.engine.core.tokenizer import ChatTemplateError, Tokenizer
from tokenops.types import OutputFields

LLAMA3 = """{{- bos_token }}{%- for m in messages %}
{%- if m.role == 'user' and tools is not none and loop.first %}<|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.

{% for t in tools %}{{ t | tojson(indent=4) }}

{% endfor %}{{ m.content }}<|eot_id|>
{%- elif 'tool_calls' in m %}{% if m.tool_calls | length != 1 %}{{ raise_exception("This model only supports single tool-calls at once!") }}{% endif %}
{%- set call = m.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>

{{ '{"name": "' + call.name + '", "parameters": ' }}{{ call.arguments | tojson }}}<|eot_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}{%- endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MISTRAL = """{%- set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{{- bos_token }}{%- for m in messages %}
{%- if m.role == 'user' %}{% if tools is defined and tools is not none and loop.index0 == ns.last_user %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]
{%- elif m.tool_calls is defined and m.tool_calls is not none %}[TOOL_CALLS][
{%- for c in m.tool_calls %}{% if c.id is not defined or c.id | length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}
{%- set out = c.function | tojson %}{{ out[:-1] }}, "id": "{{ c.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{%- elif m.role == 'tool' %}{% if m.tool_call_id | length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}[TOOL_RESULTS]{"content": {{ m.content | tojson }}, "call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]
{%- else %}{{ m.content }}{{ eos_token }}{% endif %}{%- endfor %}"""

QWEN25 = """{%- if tools %}<|im_start|>system
# Tools

<tools>{% for t in tools %}
{{ t | tojson }}{% endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

QWEN3_CODER = """{%- if tools %}<|im_start|>system
<tools>{% for t in tools %}<function><name>{{ t.function.name }}</name></function>{% endfor %}</tools><|im_end|>
{% endif %}{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
<function={{ c.function.name }}>
{% for k, v in c.function.arguments.items() %}<parameter={{ k }}>
{{ v }}
</parameter>
{% endfor %}</function>
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

SMOLLM2 = """{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
#: An OpenAI-shaped conversation: a call's arguments as JSON text, an id as OpenAI writes them.
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_8f3a2b1c9d0e4f5a6b7c8d9e", "type": "function",
                                                           "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_8f3a2b1c9d0e4f5a6b7c8d9e", "content": "Sunny, 22 C"},
]


def _tokenizer(template: str) -> Tokenizer:
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return Tokenizer(backend, {"bos_token": "<s>", "eos_token": "</s>"}, template)


@pytest.mark.parametrize(("template", "expected"), [
    (LLAMA3, ("native", "llama3_json")),
    (MISTRAL, ("native", "mistral")),
    (QWEN25, ("native", "hermes")),
    (QWEN3_CODER, ("generic", "generic")),  # renders tools, but its XML calls are no parser's format
    (SMOLLM2, ("generic", "generic")),
])
def test_the_parser_is_the_format_the_template_renders_calls_in(template, expected):
    assert tool_format_of(_tokenizer(template)) == expected


def test_a_configured_parser_wins_and_a_template_without_tools_stays_generic():
    assert tool_format_of(_tokenizer(LLAMA3), "hermes") == ("native", "hermes")
    assert tool_format_of(_tokenizer(SMOLLM2), "mistral") == ("generic", "generic")


def _stream(parser: str, text: str, piece: int, constrained: bool = False):
    stream = get_tool_call_parser(parser).stream(constrained)
    content, pieces, early = [], [], ""
    for i in range(0, len(text), piece):
        c, p = stream.push(text[i:i + piece])
        content.append(c)
        pieces += p
    early = "".join(content)
    c, p = stream.finish()
    return early, early + c, merge_tool_calls({}, pieces + p), stream


@pytest.mark.parametrize("piece", [1, 4, 1000])
@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '  {"name": "get_weather", "arguments": {"city": "Paris"}}\n',
])
def test_llama3_calls_in_any_chunking(text, piece):
    _, content, calls, stream = _stream("llama3_json", text, piece)
    assert content == "" and stream.num_calls == 1
    assert calls[0]["function"]["name"] == "get_weather" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"


def test_llama3_semicolon_separated_calls_and_text_that_is_not_a_call():
    assert [n for n, _ in parse_llama3_calls('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}')] == ["a", "b"]
    assert parse_llama3_calls('{"city": "Paris"}') is None  # JSON, but no call: the answer stays content
    early, content, calls, _ = _stream("llama3_json", '{"city": "Paris", "temp": 22}', 3)
    assert calls == {} and content == '{"city": "Paris", "temp": 22}' and early == ""  # held, then given back
    early, content, calls, _ = _stream("llama3_json", "It is sunny in Paris.", 3)
    assert calls == {} and early == content == "It is sunny in Paris."  # plain text streams as it comes


@pytest.mark.parametrize("piece", [1, 5, 1000])
@pytest.mark.parametrize("text", [
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]',
    ' [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, {"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}]',
])
def test_mistral_calls_with_or_without_the_marker(text, piece):
    _, content, calls, stream = _stream("mistral", text, piece)
    assert content == "" and stream.num_calls == 2
    assert [json.loads(calls[k]["function"]["arguments"])["city"] for k in sorted(calls)] == ["Paris", "Rome"]
    assert len({c["id"] for c in calls.values()}) == 2


def test_mistral_text_and_json_answers_stay_content():
    assert parse_mistral_calls('[1, 2, 3]') is None and parse_mistral_calls('[{"name": "a"}] trailing') is None
    _, content, calls, _ = _stream("mistral", "[1, 2, 3]", 2)
    assert calls == {} and content == "[1, 2, 3]"
    early, content, calls, _ = _stream("mistral", "Paris is sunny.", 2)
    assert calls == {} and early == content == "Paris is sunny."


def _rendered(template: str, parser: str, **body) -> str:
    plan = plan_request(OutputFields.from_body({"tools": [WEATHER], **body}), parser, HISTORY)
    return _tokenizer(template).apply_chat_template(plan.prompt_messages(HISTORY), **plan.template_kwargs)


def test_an_openai_history_renders_in_the_llama3_template():
    text = _rendered(LLAMA3, "llama3_json")
    assert '"name": "get_weather"' in text and "Given the following functions" in text  # the tools, natively
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}' in text  # arguments as an object, not quoted text
    with pytest.raises(ChatTemplateError, match="single tool-calls"):  # why the grammar writes one call
        _tokenizer(LLAMA3).apply_chat_template([HISTORY[0], {**HISTORY[1], "tool_calls": HISTORY[1]["tool_calls"] * 2}])


def test_an_openai_history_renders_in_the_mistral_template():
    with pytest.raises(ChatTemplateError, match="length 9"):  # OpenAI's ids as the client sends them
        _tokenizer(MISTRAL).apply_chat_template(HISTORY, tools=[WEATHER])
    text = _rendered(MISTRAL, "mistral")
    short = mistral_call_id(HISTORY[1]["tool_calls"][0]["id"])
    assert len(short) == 9 and short.isalnum()
    assert f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "{short}"}}]' in text
    assert f'"call_id": "{short}"' in text and "[AVAILABLE_TOOLS]" in text


def test_hermes_history_is_left_as_the_client_sent_it():
    text = _rendered(QWEN25, "hermes")
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text and "<tools>" in text


@pytest.mark.parametrize(("parser", "parallel", "good", "bad"), [
    ("llama3_json", True, '{"name": "get_weather", "parameters": {"city": "Paris"}}',
     '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name"'),
    ("mistral", True, '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]',
     '[{"name": "get_weather", "arguments": {"town"'),
    ("mistral", False, '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
     '[{"name": "get_weather", "arguments": {"city": "Paris"}}, '),
])
def test_forced_call_grammars_write_the_native_format(parser, parallel, good, bad):
    from pathlib import Path

    from tokenops.engine.sampling.grammar import GrammarCompiler, GrammarSpec

    demo = Tokenizer.from_dir(Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target")
    plan = plan_request(OutputFields.from_body(
        {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": parallel}), parser)
    assert plan.is_call_constrained and isinstance(plan.grammar, GrammarSpec)
    compiler = GrammarCompiler.for_tokenizer(demo, 8192)
    ok = compiler.compile(plan.grammar)
    assert all(ok.accept(t) for t in demo.encode(good, add_special_tokens=False)) and ok.is_finished
    refused = compiler.compile(plan.grammar)
    assert not all(refused.accept(t) for t in demo.encode(bad, add_special_tokens=False))
    calls = {"llama3_json": parse_llama3_calls, "mistral": parse_mistral_calls}[parser](good)
    assert calls and all(json.loads(a)["city"] for _, a in calls)


@pytest.mark.parametrize("piece", [1, 4, 1000])
@pytest.mark.parametrize("text", [
    # Qwen2.5-Coder's way with tool_choice auto: a fenced JSON block (or two, or an array), not <tool_call>
    '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```',
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n```json\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n```',
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
])
def test_free_hermes_answers_read_fenced_and_bare_json_calls(text, piece):
    _, content, calls, stream = _stream("hermes", text, piece)
    assert content == "" and stream.num_calls == len(calls) >= 1
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_free_hermes_code_and_prose_stay_content():
    code = '```json\n{"city": "Paris", "temperature": 22}\n```'
    _, content, calls, _ = _stream("hermes", code, 3)
    assert calls == {} and content == code  # JSON, but not a call
    early, content, calls, _ = _stream("hermes", "```python\nprint(1)\n```", 3)
    assert calls == {} and content == "```python\nprint(1)\n```"
    early, content, calls, _ = _stream("hermes", "Hello there, friend.", 2)
    assert calls == {} and early == content == "Hello there, friend."


@pytest.mark.parametrize(("parser", "text"), [
    ("hermes", '```json\n{"name": "get_author", "arguments": {"book_title": "Hamlet"}}\n```'),
    ("hermes", '<tool_call>\n{"name": "get_author", "arguments": {"book_title": "Hamlet"}}\n</tool_call>'),
    ("llama3_json", '{"name": "get_author", "parameters": {"book_title": "Hamlet"}}'),
    ("mistral", '[{"name": "get_author", "arguments": {"book_title": "Hamlet"}}]'),
])
def test_a_free_call_of_a_tool_the_request_does_not_offer_stays_text(parser, text):
    """Qwen2.5-Coder asked "Who wrote Hamlet?" beside a weather tool invents get_author: no client can run it."""
    plan = plan_request(OutputFields.from_body({"tools": [WEATHER]}), parser)
    stream = plan.new_stream()
    assert stream is not None and list(stream.offered or {}) == ["get_weather"]
    content, pieces = stream.push(text)
    more, more_pieces = stream.finish()
    assert pieces + more_pieces == [] and content + more == text and stream.num_calls == 0
    offered = plan_request(OutputFields.from_body({"tools": [WEATHER]}), parser).new_stream()
    assert offered is not None
    _, early = offered.push(text.replace("get_author", "get_weather").replace("book_title", "city"))
    assert early + offered.finish()[1] and offered.num_calls == 1


def test_a_forced_hermes_call_works_where_the_tag_is_an_added_token():
    """Qwen2.5's ``<tool_call>`` is an added token that is not special: llguidance masked the grammar's
    first step to that token alone and then refused to consume it (a 400 at a forced call's first token)."""
    from pathlib import Path

    import torch
    from tokenizers import AddedToken
    from tokenops.engine.sampling.grammar import GrammarCompiler

    tok = Tokenizer.from_dir(Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target")
    tok.backend.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    tag = tok.backend.token_to_id("<tool_call>")
    vocab = tok.backend.get_vocab_size(with_added_tokens=True)
    plan = plan_request(OutputFields.from_body({"tools": [WEATHER], "tool_choice": "required"}), "hermes")
    matcher = GrammarCompiler.for_tokenizer(tok, vocab).compile(plan.grammar)
    mask = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)
    matcher.fill_bitmask(mask, 0)
    allowed = [i for i in range(vocab) if (int(mask[0, i // 32]) >> (i % 32)) & 1]
    assert allowed and all("<tool_call>".startswith(tok.token_text(i)) for i in allowed)
    ids = tok.encode('<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>', add_special_tokens=False)
    assert tag in ids and all(matcher.accept(i) for i in ids) and matcher.is_finished


@pytest.mark.parametrize(("parser", "text"), [
    ("hermes", '```json\n{"name": "get_weather", "arguments": {}}\n```'),
    ("hermes", '```json\n{"name": "get_weather", "arguments": {"location": "your city"}}\n```'),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": 7}}\n</tool_call>'),
    ("llama3_json", '{"name": "get_weather", "parameters": {}}'),
    ("mistral", '[{"name": "get_weather", "arguments": {"town": "Paris"}}]'),
])
def test_a_free_call_whose_arguments_the_schema_refuses_stays_text(parser, text):
    """Qwen2.5-Coder greeted with "Hello!" beside a weather tool calls it with no city: a call no client
    could run as sent (a required argument missing, an unknown one, a wrong type) is the model's text."""
    stream = plan_request(OutputFields.from_body({"tools": [WEATHER]}), parser).new_stream()
    assert stream is not None
    content, pieces = stream.push(text)
    more, more_pieces = stream.finish()
    assert pieces + more_pieces == [] and content + more == text and stream.num_calls == 0
