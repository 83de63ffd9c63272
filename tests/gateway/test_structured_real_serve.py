"""Issue 34 item 3: structured outputs proven on the real model through a real ``tokenops serve`` (the
default model, no ``--model``) with the openai SDK. Twenty ``json_schema`` answers and twenty forced
tool calls, sent concurrently (the engine batches them), must all parse and validate with
``jsonschema`` against the schema sent. The 20-request runs are slow-marked (the quantized path decodes
slowly on CPU); one default-run test sends one of each.

``python -m pytest -m slow -s tests/gateway/test_structured_real_serve.py`` prints the pass counts and
wall time that ``docs/structured-outputs.md`` records.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import jsonschema
import openai
import pytest

from tests.gateway.structured_cases import JSON_CASES, TOOL_CASES
from tests.real_model import MODEL, SERVE_ENV, serve_args
from tokenops.testing_serve import ServeProcess

MAX_TOKENS = 96  # above every case's longest grammar-allowed answer (bounded strings and arrays)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("structured-real"), args=serve_args(), env=SERVE_ENV,
                      store=False) as srv:
        yield srv.base_url


def _client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=1800)


async def _json_answer(client: openai.AsyncOpenAI, name: str, prompt: str, schema: dict[str, Any]) -> str:
    out = await client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": f"{prompt} Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}})
    return out.choices[0].message.content or ""


async def _tool_arguments(client: openai.AsyncOpenAI, prompt: str, tool: dict[str, Any]) -> str:
    name = tool["function"]["name"]
    out = await client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": prompt}],
        tools=[tool], tool_choice={"type": "function", "function": {"name": name}})
    message = out.choices[0].message
    assert message.tool_calls, f"no tool call for {name}: {message.content!r}"
    assert message.tool_calls[0].function.name == name
    return message.tool_calls[0].function.arguments


def _valid(text: str, schema: dict[str, Any]) -> str | None:
    """None when ``text`` parses and validates against ``schema``, else why not."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]} in {text!r}"
    return None


async def _run_json(base_url: str, cases: list[tuple[str, str, dict[str, Any]]]) -> list[str | None]:
    async with _client(base_url) as client:
        answers = await asyncio.gather(*(_json_answer(client, *case) for case in cases))
    return [_valid(text, schema) for text, (_, _, schema) in zip(answers, cases)]


async def _run_tools(base_url: str, cases: list[tuple[str, dict[str, Any]]]) -> list[str | None]:
    async with _client(base_url) as client:
        arguments = await asyncio.gather(*(_tool_arguments(client, *case) for case in cases))
    return [_valid(text, tool["function"]["parameters"]) for text, (_, tool) in zip(arguments, cases)]


def _report(kind: str, failures: list[str | None], wall_s: float) -> None:
    passed = sum(f is None for f in failures)
    print(f"\n{kind}: {passed}/{len(failures)} schema-valid, {wall_s:.1f} s wall ({MODEL}, concurrent)")
    assert passed == len(failures), "\n".join(f for f in failures if f)


def test_one_json_schema_and_one_forced_call_are_valid(base_url):
    async def both() -> list[str | None]:
        json_failures, tool_failures = await asyncio.gather(_run_json(base_url, JSON_CASES[:1]),
                                                            _run_tools(base_url, TOOL_CASES[:1]))
        return json_failures + tool_failures

    start = time.monotonic()
    failures = asyncio.run(both())
    _report("json_schema + forced tool call", failures, time.monotonic() - start)


@pytest.mark.slow
def test_twenty_json_schema_answers_validate(base_url):
    start = time.monotonic()
    failures = asyncio.run(_run_json(base_url, JSON_CASES))
    assert len(failures) == 20
    _report("json_schema", failures, time.monotonic() - start)


@pytest.mark.slow
def test_twenty_forced_tool_calls_validate(base_url):
    start = time.monotonic()
    failures = asyncio.run(_run_tools(base_url, TOOL_CASES))
    assert len(failures) == 20
    _report("forced tool calls", failures, time.monotonic() - start)
