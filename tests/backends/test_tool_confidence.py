"""The confidence gate for free tool calls (tokenops/backends/tool_confidence.py), in process: the rule,
a call's confidence from its tokens' probabilities, and the tool-call streams dropping a gated call and
all that follows it (the backend then answers again in text), never gating a forced or reply preamble."""

from __future__ import annotations

import math

import pytest
from tokenops.backends.generic_tool_calls import NO_CALL
from tokenops.backends.local_structured import plan_request
from tokenops.backends.tool_confidence import (
    DEFAULT_MIN_CONFIDENCE,
    CallConfidence,
    gate_rule,
    min_confidence,
    text_only_grammar,
)
from tokenops.backends.tool_parsers import get_tool_call_parser
from tokenops.config import ConfigError, ModelConfig
from tokenops.types import OutputFields

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def entries(pieces: list[tuple[str, float]]) -> list[dict]:
    return [{"token": t, "logprob": math.log(p)} for t, p in pieces]


#: Qwen2.5-Coder's made-up call for "Hello! How are you?" as its tokens, with the probabilities measured
#: through serve (name 0.30, first value token "New" 0.45; the rest near 1)
MADE_UP = [
    ("```", 0.9), ("json", 0.99), ("\n", 0.99), ('{"', 0.99), ("name", 0.99), ('":', 0.99), (' "', 0.99),
    ("get", 0.30), ("_weather", 0.99), ('",', 0.99), (' "', 0.99), ("arguments", 0.99), ('":', 0.99),
    (' {"', 0.99), ("city", 0.99), ('":', 0.99), (' "', 0.99), ("New", 0.45), (" York", 0.20), ('"}}', 0.99),
    ("\n", 0.99), ("```", 0.99),
]  # fmt: skip


def tokens(text: str, marks: dict[str, float]) -> list[tuple[str, float]]:
    """``text`` as tokens: each of ``marks`` (in order, once) a token with its probability, the rest 0.99."""
    out, at = [], 0
    for mark, p in marks.items():
        where = text.index(mark, at)
        out += [(text[at:where], 0.99), (mark, p)]
        at = where + len(mark)
    return [t for t in [*out, (text[at:], 0.99)] if t[0]]


ASKED = [(t, 0.999 if p < 0.99 else p) for t, p in MADE_UP]
CALL = ("get_weather", '{"city": "New York"}')


def test_the_rule_is_the_lowest_probability_against_the_threshold():
    assert gate_rule([0.99, 0.98], 0.5) and not gate_rule([0.99, 0.45], 0.5)
    assert gate_rule([0.5], 0.5) and gate_rule([], 0.9)  # nothing judged: not gated


def test_a_calls_confidence_is_its_name_and_first_value_tokens():
    conf = CallConfidence(0.5)
    conf.add(entries(MADE_UP))
    # the name token (0.30) is the lowest; " York" (0.20) is not a first value token and does not count
    assert conf.confidence(*CALL) == pytest.approx(0.30)
    sure = CallConfidence(0.5)
    sure.add(entries(ASKED))
    assert sure.passes(*CALL) and sure.judged == [{"name": "get_weather", "confidence": 0.99, "gated": False}]
    unsure = CallConfidence(0.5)
    unsure.add(entries(MADE_UP))
    assert not unsure.passes(*CALL) and unsure.judged[0]["gated"]
    assert CallConfidence(0.5).confidence(*CALL) is None  # no tokens: not judged
    made_up = CallConfidence(0.5)
    made_up.add(entries(ASKED))
    assert not made_up.passes(*CALL, valid=False) and made_up.judged[0]["offered"] is False


def test_with_the_gate_on_a_call_of_a_function_not_offered_is_answered_again():
    stream = get_tool_call_parser("hermes").stream(False)
    conf = CallConfidence(0.5)
    stream.offered, stream.gate = {"get_weather": WEATHER["function"]["parameters"]}, conf.passes
    text = '```json\n{"name": "greet", "arguments": {"who": "you"}}\n```'
    conf.add(entries([(text, 0.99)]))
    assert stream.push(text) == ("", []) and stream.finish() == ("", []) and stream.gated


def test_a_gated_fenced_call_sends_nothing():
    conf = CallConfidence(0.5)
    stream = get_tool_call_parser("hermes").stream(False)
    stream.offered, stream.gate = {"get_weather": WEATHER["function"]["parameters"]}, conf.passes
    sent = []
    for token, _p in MADE_UP:
        conf.add(entries([(token, _p)]))
        sent.append(stream.push(token))
    sent.append(stream.finish())
    assert stream.gated and not stream.num_calls and all(s == ("", []) for s in sent)


def test_a_gated_tagged_call_keeps_the_text_before_it_and_drops_the_rest():
    conf = CallConfidence(0.5)
    stream = get_tool_call_parser("hermes").stream(False)
    stream.gate = conf.passes
    text = 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "New York"}}\n</tool_call> More.'
    conf.add(entries(tokens(text, {"get": 0.2, "New": 0.99})))
    content, calls = stream.push(text)
    assert content.strip() == "Let me check." and calls == [] and stream.gated
    assert stream.push(" more text") == ("", []) and stream.finish() == ("", [])


def test_a_confident_call_passes_and_a_second_gated_one_is_dropped():
    conf = CallConfidence(0.5)
    stream = get_tool_call_parser("hermes").stream(False)
    stream.gate = conf.passes
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    two = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
    conf.add(entries(tokens(one, {"Paris": 0.98})))
    conf.add(entries(tokens(two, {"Lima": 0.1})))
    _, first = stream.push(one)
    _, second = stream.push(two)
    assert [p["function"]["name"] for p in first if "id" in p] == ["get_weather"] and second == []
    assert stream.num_calls == 1 and stream.gated  # the backend does not answer again: a call was sent


def test_the_generic_reply_preamble_is_never_gated():
    stream = get_tool_call_parser("generic").stream(True)
    stream.gate = lambda name, arguments, valid: False  # would refuse any call
    content, calls = stream.push(NO_CALL + " Hello there!")
    assert content == "Hello there!" and calls == [] and not stream.gated


def test_only_free_calls_are_gated():
    fields = OutputFields(tools=[WEATHER], tool_choice="auto")
    assert plan_request(fields, "hermes").is_free and plan_request(fields, "generic").is_free
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}, "none"):
        assert not plan_request(OutputFields(tools=[WEATHER], tool_choice=choice), "hermes").is_free
    rf = {"type": "json_object"}
    assert not plan_request(OutputFields(tools=[WEATHER], tool_choice="auto", response_format=rf), "hermes").is_free


def test_the_answer_again_grammar_cannot_open_a_call():
    generic = text_only_grammar("generic", get_tool_call_parser("generic"))
    assert NO_CALL.replace('"', '\\"') in generic.source and "call:" not in generic.source
    native = text_only_grammar("hermes", get_tool_call_parser("hermes"))
    assert native.kind == "lark" and "{" in native.source.split("[^")[1].split("]")[0]


def test_the_threshold_setting_is_checked():
    assert ModelConfig(name="m").tool_call_min_confidence is None  # the format's default
    assert min_confidence(None, "hermes") == DEFAULT_MIN_CONFIDENCE > 0 and min_confidence(None, "generic") == 0
    assert min_confidence(0.7, "generic") == 0.7 and min_confidence(0, "hermes") == 0
    assert ModelConfig(name="m", tool_call_min_confidence=0).tool_call_min_confidence == 0
    for bad in (1.5, -0.1, "high", True):
        with pytest.raises(ConfigError, match="tool_call_min_confidence"):
            ModelConfig(name="m", tool_call_min_confidence=bad)  # type: ignore[arg-type]
