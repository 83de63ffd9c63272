"""The decision record is written through ``GatewayRequest.decide`` (checked against
``tokenops.types.Decisions``), and the store's ``decisions`` JSON keeps the shape it had before:
a real ``tokenops serve`` (the toy model) driven by the openai SDK, its DuckDB rows read back.

``BEFORE`` is what the code before ``decide`` (main at 74e9799, where steps wrote
``request.decisions[key] = value``) stored for these three requests, read with the same queries."""

from __future__ import annotations

import json

import duckdb
import openai

from tokenops.testing_serve import ServeProcess

ROUTE = {"model": "tokenops-demo", "reason": "requested", "router": "route_by_name", "score": None}
#: (stream, decisions) per request, in order; a float stands for a validator's score (any value)
BEFORE = [
    (False, {"cache": "miss", "replica": "tokenops-demo#0", "route": ROUTE}),
    (True, {"cache": "miss", "replica": "tokenops-demo#0", "route": ROUTE, "validate": float}),
    (False, {"cache": "miss", "replica": "tokenops-demo#0", "route": ROUTE, "validate": float}),
]


def _same_shape(stored: object, expected: object) -> bool:
    if expected is float:
        return isinstance(stored, float)
    if isinstance(expected, dict):
        return isinstance(stored, dict) and stored.keys() == expected.keys() and all(
            _same_shape(stored[k], v) for k, v in expected.items()
        )
    return stored == expected and type(stored) is type(expected)


def test_stored_decisions_keep_their_shape(tmp_path):
    with ServeProcess(tmp_path, env={"TOKENOPS_DEFAULT_MODEL": "tokenops-demo"}) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
        ask = [{"role": "user", "content": "Say hi."}]
        client.chat.completions.create(model="tokenops-demo", messages=ask, max_tokens=4, temperature=0, user="u1")
        chunks = client.chat.completions.create(
            model="tokenops-demo",
            messages=ask,
            max_tokens=4,
            stream=True,
            logprobs=True,
            top_logprobs=2,
            stream_options={"include_usage": True},
        )
        assert [c for c in chunks if c.usage is not None]  # the typed include_usage still acts
        echo = client.completions.create(model="tokenops-demo", prompt="Hello", max_tokens=3, echo=True, logprobs=1)
        assert echo.choices[0].text.startswith("Hello") and echo.choices[0].logprobs.tokens  # echo and logprobs act
    with duckdb.connect(str(srv.store_path), read_only=True) as con:
        rows = con.execute("select stream, decisions from requests order by ts").fetchall()
    stored = [(stream, json.loads(decisions)) for stream, decisions in rows]
    assert len(stored) == len(BEFORE)
    for (stream, decisions), (was_stream, before) in zip(stored, BEFORE):
        assert stream == was_stream and _same_shape(decisions, before), (decisions, before)
