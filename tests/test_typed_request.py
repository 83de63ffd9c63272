"""The typed request: sampling fields read once from the body, and every decision key the core and
the built-in plugins write declared (with its type) in ``tokenops.types.Decisions``."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from tokenops.gateway.schemas import chat_request, completion_request
from tokenops.types import Decisions, GatewayRequest, SamplingFields

ROOT = Path(__file__).resolve().parents[1]


def _written_decision_keys() -> dict[str, str]:
    """key -> where, for ``….decisions["key"] = …`` and ``….decisions.setdefault("key", …)``."""
    found: dict[str, str] = {}
    for base in ("tokenops", "tokenops_plugins"):
        for path in (ROOT / base).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                target = None
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                    sub = node.targets[0]
                    if getattr(sub.value, "attr", getattr(sub.value, "id", None)) == "decisions":
                        target = sub.slice
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setdefault"
                      and getattr(node.func.value, "attr", getattr(node.func.value, "id", None)) == "decisions"):
                    target = node.args[0]
                if isinstance(target, ast.Constant) and isinstance(target.value, str):
                    found.setdefault(target.value, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_decision_key_written_is_declared():
    written = _written_decision_keys()
    assert {"route", "cache", "replica", "retries", "fallbacks", "rate_limit"} <= set(written)  # the scan works
    undeclared = {k: v for k, v in written.items() if k not in Decisions.__annotations__}
    assert not undeclared, f"declare these in tokenops.types.Decisions: {undeclared}"


def test_sampling_fields_are_read_once_with_what_was_sent():
    req = chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5,
                        "stop": "END", "max_completion_tokens": 7}, 256)
    assert req.sampling == SamplingFields(temperature=0.5, stop=("END",), is_max_tokens_sent=True)
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
