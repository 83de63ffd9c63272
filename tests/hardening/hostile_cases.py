"""The hostile-input families of Hardening III (issue 51), shared by the suite
(``tests/hardening/test_hostile_suite.py``) and the benchmark (``tests/benchmarks/hostile.py``).

Each :class:`Case` is one thing a client can do to a running ``tokenops serve``: one request, or a
short sequence (a chain of stored responses, requests abandoned by their clients). ``run`` sends it
and returns the status codes the server answered. What a case may get back: any 4xx, or a 200 where
the request is legitimately served (a bounded answer); never a 5xx, never a stall of ``/health``,
never unbounded memory. Bodies are built once per process and cached: the client's own JSON work
must not be what the probe measures.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

API_KEY = "hostile3-api-key-123"
ADMIN_KEY = "hostile3-admin-key-123"
TENANT = "hostile"
#: the served model: the default model (SmolLM2) when the suite runs it, renamed here for short bodies
MODEL = "smollm2-135m-instruct"


def api_headers() -> dict[str, str]:
    return {
        "authorization": f"Bearer {API_KEY}",
        "x-api-key": API_KEY,
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
    }


def admin_headers() -> dict[str, str]:
    return {"x-admin-key": ADMIN_KEY, "content-type": "application/json"}


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    run: Callable[[httpx.Client], list[int]]
    #: statuses this case must get (empty: any status below 500)
    expect: frozenset[int] = field(default_factory=frozenset)

    def verdict(self, statuses: list[int]) -> str | None:
        """None when every status is allowed, else what is wrong."""
        for s in statuses:
            if s >= 500:
                return f"{self.name}: answered {s}"
            if self.expect and s not in self.expect:
                return f"{self.name}: answered {s}, expected one of {sorted(self.expect)}"
        return None


def _post(
    path: str, body: Callable[[], Any], key: str = "api", method: str = "POST", headers: dict[str, str] | None = None
) -> Callable[[httpx.Client], list[int]]:
    @functools.cache
    def encoded() -> bytes:
        b = body()
        return b if isinstance(b, bytes) else json.dumps(b).encode()

    def send(client: httpx.Client) -> list[int]:
        h = (api_headers() if key == "api" else admin_headers()) | (headers or {})
        return [client.request(method, path, content=encoded(), headers=h).status_code]

    return send


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


# --- schema budget: nested repetition in a pattern -------------------------------------------
NESTED_PATTERN = {"type": "string", "pattern": "^((((a{50}){50}){50}){50})$"}  # 6.25e6 characters, 4 levels
NESTED_PATTERN_OBJ = {"type": "object", "properties": {"s": NESTED_PATTERN}, "required": ["s"]}


def _tool(parameters: Any, name: str = "f") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "a tool", "parameters": parameters}}


def _schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _big_tool_schema(target_bytes: int = 300_000) -> dict[str, Any]:
    """A tool schema of about ``target_bytes``: many described properties (legal, just large)."""
    props: dict[str, Any] = {}
    i = 0
    while len(json.dumps(props)) < target_bytes:
        props[f"field_{i}"] = {"type": "string", "description": f"property number {i} " + "x" * 60}
        i += 1
    return {"type": "object", "properties": props}


def _messages(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra}


def _deep_object(depth: int = 20_000) -> bytes:
    return b'{"model": "' + MODEL.encode() + b'", "metadata": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"


def _chain(turns: int = 40, item_bytes: int = 200_000) -> Callable[[httpx.Client], list[int]]:
    """A ``previous_response_id`` chain whose every turn carries ``item_bytes`` of input the model
    never reads (a reasoning item's encrypted content) beside a short question."""
    filler = "e" * item_bytes

    def send(client: httpx.Client) -> list[int]:
        statuses, previous = [], None
        for turn in range(turns):
            body: dict[str, Any] = {
                "model": MODEL,
                "max_output_tokens": 2,
                "store": True,
                "input": [
                    {"type": "reasoning", "id": f"rs_{turn}", "summary": [], "encrypted_content": filler},
                    {"role": "user", "content": f"turn {turn}: say ok"},
                ],
            }
            if previous:
                body["previous_response_id"] = previous
            r = client.post("/v1/responses", content=json.dumps(body).encode(), headers=api_headers())
            statuses.append(r.status_code)
            if r.status_code != 200:
                break  # refused: the bound the chain met (a 4xx)
            previous = r.json()["id"]
        return statuses

    return send


def _running(client: httpx.Client) -> float:
    """The engine's running requests, from ``/metrics`` (vLLM's name under ``tokenops:``)."""
    text = client.get("/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("tokenops:num_requests_running")
    )


def _abandon(num_requests: int = 8, leave_after_s: float = 3.0) -> Callable[[httpx.Client], list[int]]:
    """Non-streamed requests asking 3,000 tokens (two per route: chat, completions, Responses,
    Messages) whose clients leave after ``leave_after_s``: the engine must run none of them 2 s
    later (their KV freed), and a two-token request is then answered. Returns that request's
    status, or 504 (a fail) when requests were still running 2 s after the clients left."""

    def leave(path: str, body: dict[str, Any]) -> None:
        try:
            with httpx.Client(base_url=CLIENT_BASE_URL[0], timeout=leave_after_s) as c:
                c.post(path, content=json.dumps(body).encode(), headers=api_headers())
        except httpx.HTTPError:
            pass

    def send(client: httpx.Client) -> list[int]:
        long = "Write a very long story about a lighthouse keeper. " * 20
        routes = [
            (
                "/v1/chat/completions",
                {
                    "model": MODEL,
                    "max_tokens": 3000,
                    "ignore_eos": True,
                    "messages": [{"role": "user", "content": long}],
                },
            ),
            ("/v1/completions", {"model": MODEL, "max_tokens": 3000, "ignore_eos": True, "prompt": long}),
            ("/v1/responses", {"model": MODEL, "max_output_tokens": 3000, "input": long, "store": False}),
            ("/v1/messages", {"model": MODEL, "max_tokens": 3000, "messages": [{"role": "user", "content": long}]}),
        ]
        threads = [threading.Thread(target=leave, args=routes[i % len(routes)]) for i in range(num_requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 2.0
        while _running(client) > 0:
            if time.monotonic() > deadline:
                return [504]
            time.sleep(0.1)
        r = client.post(
            "/v1/chat/completions", content=json.dumps(_chat(max_tokens=2)).encode(), headers=api_headers(), timeout=60
        )
        return [r.status_code]

    return send


#: the base URL the abandoning clients use (set by :func:`cases`)
CLIENT_BASE_URL: list[str] = [""]


def _lora_folder(kind: str) -> str:
    """An adapter folder under the suite's adapter root: ``malformed`` (a config that is not an
    object of the right fields) or ``garbage`` (not JSON at all)."""
    root = Path(LORA_ROOT[0])
    folder = root / f"bad-{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    config = '{"r": "eight", "lora_alpha": [], "target_modules": 7}' if kind == "malformed" else "{not json"
    (folder / "adapter_config.json").write_text(config)
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return str(folder)


#: the folder the suite's server loads adapters from (``[lora] roots``)
LORA_ROOT: list[str] = [os.path.join(tempfile.gettempdir(), f"tokenops-hostile-lora-{os.getpid()}")]


def cases(base_url: str) -> list[Case]:
    CLIENT_BASE_URL[0] = base_url
    out = [
        # stored state
        Case("stored chains", "chain 40 turns x 200 KB unread input", _chain()),
        # one budget rule for schema work
        Case(
            "schema budget",
            "nested pattern, chat, max_tokens 2^31-1",
            _post(
                "/v1/chat/completions",
                lambda: _chat(max_tokens=2**31 - 1, response_format=_schema_format(NESTED_PATTERN)),
            ),
            frozenset({400}),
        ),
        Case(
            "schema budget",
            "nested pattern, chat, no max_tokens",
            _post(
                "/v1/chat/completions",
                lambda: {
                    k: v for k, v in _chat(response_format=_schema_format(NESTED_PATTERN)).items() if k != "max_tokens"
                },
            ),
            frozenset({400}),
        ),
        Case(
            "schema budget",
            "nested pattern, responses text.format",
            _post(
                "/v1/responses",
                lambda: {
                    "model": MODEL,
                    "input": "hi",
                    "store": False,
                    "text": {"format": {"type": "json_schema", "name": "x", "schema": NESTED_PATTERN_OBJ}},
                },
            ),
            frozenset({400}),
        ),
        Case(
            "schema budget",
            "nested pattern, responses forced tool",
            _post(
                "/v1/responses",
                lambda: {
                    "model": MODEL,
                    "input": "hi",
                    "store": False,
                    "tool_choice": "required",
                    "tools": [{"type": "function", "name": "f", "parameters": NESTED_PATTERN_OBJ}],
                },
            ),
            frozenset({400}),
        ),
        Case(
            "schema budget",
            "nested pattern, messages tool",
            _post(
                "/v1/messages",
                lambda: _messages(
                    tools=[{"name": "f", "input_schema": NESTED_PATTERN_OBJ}], tool_choice={"type": "tool", "name": "f"}
                ),
            ),
            frozenset({400}),
        ),
        Case(
            "schema budget",
            "nested pattern, count_tokens",
            _post(
                "/v1/messages/count_tokens",
                lambda: {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"name": "f", "input_schema": NESTED_PATTERN_OBJ}],
                },
            ),
            frozenset({400}),
        ),
        Case(
            "schema budget",
            "nested pattern, /tokenize",
            _post(
                "/tokenize",
                lambda: {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [_tool(NESTED_PATTERN_OBJ)],
                },
            ),
            frozenset({400}),
        ),
        # work that must not run on the event loop
        Case(
            "event loop",
            "count_tokens, 300 KB tool schema",
            _post(
                "/v1/messages/count_tokens",
                lambda: {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"name": "f", "input_schema": _big_tool_schema()}],
                },
            ),
        ),
        Case(
            "event loop",
            "/tokenize, 300 KB tool schema",
            _post(
                "/tokenize",
                lambda: {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [_tool(_big_tool_schema())],
                },
            ),
        ),
        Case(
            "event loop",
            "logit_bias 100k entries",
            _post("/v1/chat/completions", lambda: _chat(logit_bias={str(i): 1 for i in range(100_000)})),
            frozenset({400}),
        ),
        Case(
            "event loop",
            "completions 100k prompts",
            _post("/v1/completions", lambda: {"model": MODEL, "max_tokens": 1, "prompt": ["hi"] * 100_000}),
            frozenset({400}),
        ),
        Case(
            "event loop",
            "responses 100k input items",
            _post(
                "/v1/responses",
                lambda: {
                    "model": MODEL,
                    "store": False,
                    "max_output_tokens": 1,
                    "input": [{"role": "user", "content": "hi"}] * 100_000,
                },
            ),
            frozenset({400}),
        ),
        Case(
            "event loop",
            "responses metadata 3 MB",
            _post(
                "/v1/responses",
                lambda: {
                    "model": MODEL,
                    "store": False,
                    "input": "hi",
                    "max_output_tokens": 1,
                    "metadata": {f"k{i}": "v" * 500 for i in range(6000)},
                },
            ),
            frozenset({400}),
        ),
        Case(
            "event loop",
            "n 128 x top_logprobs 20",
            _post("/v1/chat/completions", lambda: _chat(n=128, logprobs=True, top_logprobs=20, max_tokens=16)),
        ),
        # 500s
        *[
            Case("no 500", f"object nested 20,000 deep, {path}", _post(path, _deep_object), frozenset({400}))
            for path in (
                "/v1/chat/completions",
                "/v1/completions",
                "/v1/responses",
                "/v1/messages",
                "/v1/messages/count_tokens",
                "/tokenize",
                "/v1/embeddings",
            )
        ],
        Case(
            "no 500",
            "admin key, expires_at year 99999",
            _post("/admin/keys", lambda: {"tenant": TENANT, "expires_at": "99999-01-01T00:00:00Z"}, "admin"),
            frozenset({400, 422}),
        ),
        Case(
            "no 500",
            "admin key, expires_at 1e20",
            _post("/admin/keys", lambda: {"tenant": TENANT, "expires_at": 1e20}, "admin"),
            frozenset({400, 422}),
        ),
        Case(
            "no 500",
            "admin lora, malformed adapter_config.json",
            _post("/admin/lora", lambda: {"name": "bad-malformed", "path": _lora_folder("malformed")}, "admin"),
            frozenset({400}),
        ),
        Case(
            "no 500",
            "admin lora, adapter_config.json not JSON",
            _post("/admin/lora", lambda: {"name": "bad-garbage", "path": _lora_folder("garbage")}, "admin"),
            frozenset({400}),
        ),
        # access edges
        Case(
            "access",
            "admin lora, path outside the roots",
            _post("/admin/lora", lambda: {"name": "etc", "path": "/etc"}, "admin"),
            frozenset({400, 403, 404}),
        ),
        Case(
            "access",
            "admin lora, name with a path",
            _post("/admin/lora", lambda: {"name": "../../x", "path": LORA_ROOT[0]}, "admin"),
            frozenset({400}),
        ),
        # spec
        Case(
            "spec",
            "messages, text/plain body",
            _post("/v1/messages", lambda: _messages(), headers={"content-type": "text/plain"}),
            frozenset({200, 415}),
        ),
        Case("spec", "PUT /v1/messages", _post("/v1/messages", lambda: _messages(), method="PUT"), frozenset({405})),
        Case(
            "spec",
            "max_output_tokens 1e12",
            _post(
                "/v1/responses", lambda: {"model": MODEL, "input": "hi", "store": False, "max_output_tokens": 10**12}
            ),
            frozenset({400}),
        ),
        # abandoned work
        Case(
            "abandoned work",
            "8 non-streamed 3,000-token requests left after 3 s: none running 2 s later",
            _abandon(),
            frozenset({200}),
        ),
    ]
    return out


@dataclass(frozen=True)
class Measured:
    case: Case
    statuses: list[int]
    seconds: float
    health_p50_ms: float
    health_p99_ms: float
    health_max_ms: float
    rss_before_mib: float
    rss_growth_mib: float


def measure(case: Case, client: httpx.Client, probe: Any) -> Measured:
    """Run one case while ``probe`` (tests/hardening/health_probe.py) watches the server."""
    from health_probe import rss_bytes

    before = rss_bytes(probe.pid)
    t0 = time.monotonic()
    try:
        statuses = case.run(client)
    except httpx.HTTPError as e:  # the server closed or stalled past the client's timeout: a failure
        statuses = [599]
        print(f"{case.name}: {type(e).__name__}: {e}")
    t1 = time.monotonic()
    window = probe.window(t0, t1)
    after = max([rss_bytes(probe.pid), *window.rss])
    return Measured(
        case, statuses, t1 - t0, window.p50_ms, window.p99_ms, window.max_ms, before / 2**20, (after - before) / 2**20
    )


def server_config(model_path: str) -> str:
    """The suite's server: the given model as ``MODEL``, one API key, adapters from ``LORA_ROOT``."""
    Path(LORA_ROOT[0]).mkdir(parents=True, exist_ok=True)
    return (
        f'[[models]]\nname = "{MODEL}"\nbackend = "local"\npath = {json.dumps(model_path)}\n\n'
        f'[gateway]\napi_keys = {{ "{API_KEY}" = "{TENANT}" }}\n\n'
        f"[lora]\nroots = [{json.dumps(LORA_ROOT[0])}]\n"
    )
