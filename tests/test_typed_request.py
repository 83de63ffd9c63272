"""The typed request: sampling fields read once from the body, and every decision key declared with
its type: the core's in ``tokenops.types.Decisions``, a plugin's by the plugin (``tokenops_register_decisions``)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from tokenops.gateway.openai.schemas import chat_request, completion_request
from tokenops.types import DecisionError, Decisions, GatewayRequest, OutputFields, SamplingFields

ROOT = Path(__file__).resolve().parents[1]


def _decision_writes() -> tuple[dict[str, str], list[str]]:
    """(key -> where, for ``….decide("key", …)`` and ``….add_decision("key", …)``; the places that write
    ``….decisions`` by hand: ``decisions["key"] = …``, ``decisions["key"]["sub"] = …``, ``.setdefault``,
    ``.update``, ``.pop``)."""
    found: dict[str, str] = {}
    by_hand: list[str] = []
    for base in ("tokenops", "plugins", "tokenops_plugins"):
        for path in (ROOT / base).rglob("*.py") if (ROOT / base).is_dir() else ():
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    attr, owner = node.func.attr, node.func.value
                    if attr in ("decide", "add_decision") and node.args and isinstance(node.args[0], ast.Constant):
                        found.setdefault(node.args[0].value, where)
                    elif attr in ("setdefault", "update", "pop", "__setitem__") and _names_decisions(owner):
                        by_hand.append(where)
                elif isinstance(node, (ast.Assign, ast.AugAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(isinstance(t, ast.Subscript) and _names_decisions(t.value) for t in targets):
                        by_hand.append(where)
    return found, by_hand


def _names_decisions(node: ast.AST) -> bool:
    """``….decisions`` or ``decisions``, or a subscript of one (``decisions["ensemble"]``)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return getattr(node, "attr", getattr(node, "id", None)) == "decisions"


def test_every_decision_is_written_through_decide_with_a_declared_key():
    """The core's keys are declared in Decisions; a plugin's only by the plugin (tokenops_register_decisions)."""
    from tokenops import decision_keys
    from tokenops.plugin_manager import get_plugin_manager

    get_plugin_manager()  # the built-in plugins declare their keys as they load
    written, by_hand = _decision_writes()
    assert {"route", "cache", "replica", "retries", "fallbacks", "rate_limit"} <= set(written)  # the scan works
    core = {k: v for k, v in written.items() if not v.startswith("tokenops_plugins")}
    by_plugins = {k: v for k, v in written.items() if v.startswith("tokenops_plugins")}
    undeclared = {k: v for k, v in core.items() if k not in Decisions.__annotations__}
    assert not undeclared, f"declare these in tokenops.types.Decisions: {undeclared}"
    undeclared = {k: v for k, v in by_plugins.items() if k not in decision_keys.declared()}
    assert not undeclared, f"declare these in the plugin's tokenops_register_decisions: {undeclared}"
    in_core = {k: v for k, v in by_plugins.items() if k in Decisions.__annotations__ and k not in core}
    assert not in_core, f"only the plugin that writes these declares them, not tokenops.types.Decisions: {in_core}"
    assert not by_hand, f"write decisions through GatewayRequest.decide / add_decision: {by_hand}"


def test_a_plugin_declares_its_decision_keys_and_gets_them_checked(register_plugin):
    from tokenops import hookimpl
    from tokenops.plugin_manager import PluginLoadError

    class Mine:
        @hookimpl
        def tokenops_register_decisions(self, register):
            register("my_score", float)
            register("my_notes", dict[str, Any])

    req = GatewayRequest(kind="chat", model="m", body={"messages": []}, messages=[])
    with pytest.raises(DecisionError, match="'my_score' is not declared"):
        req.decide("my_score", 0.5)
    register_plugin(Mine(), "mine")
    req.decide("my_score", 1)
    req.decide("my_notes", {"a": 1})
    with pytest.raises(DecisionError, match="'my_score' takes int | float, got str"):
        req.decide("my_score", "high")

    class Thief:  # a core key, or another plugin's key with another type: refused at load, in one line
        @hookimpl
        def tokenops_register_decisions(self, register):
            register("cache", str)

    class Rival:
        @hookimpl
        def tokenops_register_decisions(self, register):
            register("my_score", str)

    for plugin, words in ((Thief(), "which the core owns"), (Rival(), "with another type than mine")):
        with pytest.raises(PluginLoadError, match=words):
            register_plugin(plugin, type(plugin).__name__.lower())
    req.decide("my_score", 2.0)  # the rival's refusal left the first declaration alone


def test_decide_refuses_an_unknown_key_and_a_value_of_the_wrong_type():
    req = GatewayRequest(kind="chat", model="m", body={"messages": []}, messages=[])
    with pytest.raises(DecisionError, match="'routing' is not declared"):
        req.decide("routing", {"model": "m"})
    with pytest.raises(DecisionError, match="'cache' takes str, got bool"):
        req.decide("cache", True)
    with pytest.raises(DecisionError, match="'validate' takes int | float, got bool"):
        req.decide("validate", True)  # a bool is no score
    with pytest.raises(DecisionError, match="'fallbacks' takes list"):
        req.decide("fallbacks", {"from": "a"})
    assert req.decisions == {}  # nothing refused was kept
    req.decide("budget", "refused:tenant")
    req.decide("budget", {"reserved_usd": 0.5})  # either type of a union
    req.decide("validate", 1)  # an int is a score
    req.add_decision("retries", {"from": "m#0", "error": "timeout"})
    req.add_decision("retries", {"from": "m#1", "error": "overload"})
    assert json.loads(json.dumps(req.decisions)) == {
        "budget": {"reserved_usd": 0.5},
        "validate": 1,
        "retries": [{"from": "m#0", "error": "timeout"}, {"from": "m#1", "error": "overload"}],
    }


def test_sampling_fields_are_read_once_with_what_was_sent():
    req = chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.5,
            "stop": "END",
            "max_completion_tokens": 7,
        },
        256,
    )
    assert req.sampling == SamplingFields(temperature=0.5, stop=("END",), max_tokens=7)
    assert req.sampling.sent() == {"temperature", "stop", "max_tokens"} and req.max_tokens == 7
    plain = completion_request({"model": "m", "prompt": "hi"}, 256)
    assert plain.sampling == SamplingFields() and plain.max_tokens == 256


def test_override_sampling_changes_fields_and_body_alike():
    req = GatewayRequest(kind="chat", model="m", body={"seed": 3, "messages": []}, messages=[])
    req.override_sampling(temperature=0.8, seed=None)
    assert (req.sampling.temperature, req.sampling.seed) == (0.8, None)
    assert req.body == {"messages": [], "temperature": 0.8}
    copy = dataclasses.replace(req, body={**req.body, "n": 2}, sampling=None)  # a new body: read again
    assert copy.sampling.n == 2 and copy.sampling.temperature == 0.8


def test_output_and_penalty_fields_are_read_once_with_what_was_sent():
    req = chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True,
            "top_logprobs": 2,
            "presence_penalty": 1,
            "logit_bias": {"5": -100},
            "min_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "reasoning_effort": "low",
            "response_format": {"type": "json_object"},
        },
        256,
    )
    assert req.output == OutputFields(
        logprobs=True,
        top_logprobs=2,
        include_usage=True,
        reasoning_effort="low",
        response_format={"type": "json_object"},
    )
    assert (req.sampling.presence_penalty, req.sampling.logit_bias, req.sampling.min_tokens) == (1.0, {"5": -100}, 3)
    assert req.sampling.sent() == {"presence_penalty", "logit_bias", "min_tokens"}
    plain = chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 256)
    assert plain.output == OutputFields() and plain.body["logprobs"] is False  # the schema's default: not sent
    assert not plain.output.wants_logprobs("chat")
    echo = completion_request({"model": "m", "prompt": "hi", "echo": True, "logprobs": 0, "max_tokens": 0}, 256)
    assert echo.output == OutputFields(logprobs=0, echo=True) and echo.output.wants_logprobs("completion")
