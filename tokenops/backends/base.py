"""The ``Backend`` protocol every backend kind implements, and the objects it yields.

A backend serves one model replica. The gateway calls ``chat``/``complete`` for
non-streamed requests and ``stream`` for streamed ones; ``stream`` yields
:class:`Delta` objects (text plus the number of tokens it holds) and a last
delta carrying the usage. Failures are raised as :class:`tokenops.types.BackendError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tokenops.types import BackendError, GatewayRequest, GatewayResponse


@dataclass(slots=True)
class Delta:
    """A piece of a streamed answer for choice ``index``.

    ``num_tokens`` counts the tokens in ``text``; ``logprobs`` holds those tokens'
    logprobs in OpenAI's shape for the request kind (chat: ``{"content": [...]}``;
    completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``). The usage
    fields are set on the final delta only (``is_usage``).

    Chat only, for tool calling and structured outputs (any backend may set them):
    ``tool_calls`` holds tool-call pieces exactly as OpenAI streams them in
    ``choices[i].delta.tool_calls``: ``[{"index": k, "id": "call_..", "type": "function",
    "function": {"name": "...", "arguments": "<piece>"}}]``, where ``k`` is the call's
    position in the message; the first piece of call ``k`` carries ``id``, ``type`` and
    ``function.name``, later pieces only ``index`` and ``function.arguments`` (a fragment
    of the JSON text; the concatenation is the call's ``arguments``). The gateway
    forwards them unchanged and :func:`merge_tool_calls` assembles them. ``refusal``
    is a piece of the refusal text (``choices[i].delta.refusal``). ``num_tokens``
    counts the tokens of these pieces too.
    """

    index: int = 0
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    tool_calls: list[dict[str, Any]] | None = None
    refusal: str | None = None
    #: Chat only: other fields of an upstream's ``delta`` (vLLM's ``reasoning_content``, ...),
    #: forwarded to the client unchanged in a chunk of their own.
    extra: dict[str, Any] | None = None
    #: Usage delta, engines that know it: seconds waiting for the scheduler, and from then to the first token.
    queue_s: float | None = None
    prefill_s: float | None = None
    #: Usage delta: completion tokens spent thinking (``completion_tokens_details.reasoning_tokens``), when known.
    reasoning_tokens: int | None = None

    @property
    def is_usage(self) -> bool:
        return self.prompt_tokens is not None


@runtime_checkable
class Backend(Protocol):
    """One replica of one model. ``name`` is the replica name (``model#0``)."""

    name: str
    kind: str
    model: str

    @property
    def max_model_len(self) -> int | None:
        """Context window in tokens, when known (None: let the server decide)."""

    @property
    def ready(self) -> bool:
        """True once the backend can serve (model loaded, upstream reachable)."""

    async def start(self) -> None:
        """Load or connect; called once before the gateway serves."""

    async def chat(self, request: GatewayRequest) -> GatewayResponse:
        """Answer a chat request in one piece."""

    async def complete(self, request: GatewayRequest) -> GatewayResponse:
        """Answer a completion request in one piece."""

    def stream(self, request: GatewayRequest) -> AsyncIterator[Delta]:
        """Stream the answer to a chat or completion request as deltas; the last
        delta carries the usage. Closing the iterator aborts the request."""

    def stats(self) -> dict[str, Any] | None:
        """Engine statistics (the bundled engine's ``stats()`` keys), or None."""

    def apply_tunables(self, values: dict[str, Any]) -> dict[str, Any]:
        """Apply live ``engine.*`` tunables; return what was applied."""

    async def close(self) -> None:
        """Release the engine or connection pool."""


@dataclass(slots=True)
class Replica:
    """A backend as the replica-selection hook sees it."""

    name: str
    model: str
    backend: Backend
    index: int = 0
    in_flight: int = 0
    labels: dict[str, Any] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return bool(self.backend.ready)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """The one place a request enters and leaves :attr:`in_flight` (replica selection reads it)."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1


async def collect(deltas: AsyncIterator[Delta], model: str, backend: str | None = None) -> GatewayResponse:
    """Drain a delta stream into one :class:`GatewayResponse` (used by backends whose
    non-streamed path is their streamed one)."""
    texts: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    logprobs: dict[int, dict[str, Any] | None] = {}
    tool_calls: dict[int, dict[int, dict[str, Any]]] = {}
    refusals: dict[int, list[str]] = {}
    others: dict[int, dict[str, Any]] = {}  # Delta.extra per choice: strings concatenated (reasoning_content)
    num_tokens = 0
    usage: Delta | None = None
    first_token_at: float | None = None
    async for d in deltas:
        if d.is_usage:
            usage = d
            continue
        texts.setdefault(d.index, []).append(d.text)
        num_tokens += d.num_tokens
        if first_token_at is None and d.num_tokens:
            first_token_at = time.perf_counter()
        if d.finish_reason is not None:
            finish[d.index] = d.finish_reason
        if d.logprobs:
            logprobs[d.index] = merge_logprobs(logprobs.get(d.index), d.logprobs)
        if d.tool_calls:
            merge_tool_calls(tool_calls.setdefault(d.index, {}), d.tool_calls)
        if d.refusal:
            refusals.setdefault(d.index, []).append(d.refusal)
        for key, value in (d.extra or {}).items():
            acc = others.setdefault(d.index, {})
            acc[key] = (
                acc.get(key, "") + value if isinstance(value, str) and isinstance(acc.get(key, ""), str) else value
            )
    indexes = sorted(texts) or [0]
    choices: list[dict[str, Any]] = [
        {
            "index": i,
            "text": "".join(texts.get(i, [])),
            "finish_reason": finish.get(i, "stop"),
            "logprobs": logprobs.get(i),
            "tool_calls": [tool_calls[i][k] for k in sorted(tool_calls[i])] if tool_calls.get(i) else None,
            "refusal": "".join(refusals[i]) if i in refusals else None,
            "message_extra": others.get(i),
        }
        for i in indexes
    ]
    first = choices[0]
    return GatewayResponse(
        text=first["text"],
        model=model,
        finish_reason=first["finish_reason"],
        tool_calls=first["tool_calls"],
        refusal=first["refusal"],
        prompt_tokens=(usage.prompt_tokens or 0) if usage else 0,
        completion_tokens=(usage.completion_tokens if usage and usage.completion_tokens is not None else num_tokens),
        cached_tokens=(usage.cached_tokens or 0) if usage else 0,
        backend=backend,
        extra={
            "choices": choices,
            "first_token_at": first_token_at,
            "queue_s": usage.queue_s if usage else None,
            "prefill_s": usage.prefill_s if usage else None,
        },
        reasoning_tokens=usage.reasoning_tokens if usage else None,
    )


def merge_logprobs(acc: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    """Append one delta's OpenAI-shaped logprobs to those collected so far."""
    if not more:
        return acc
    if acc is None:
        return {k: list(v) if isinstance(v, list) else v for k, v in more.items()}
    for key, value in more.items():
        if isinstance(value, list):
            acc.setdefault(key, []).extend(value)
    return acc


def merge_tool_calls(calls: dict[int, dict[str, Any]], pieces: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Fold streamed tool-call pieces (``Delta.tool_calls``) into ``calls`` (call index ->
    complete call in OpenAI's message shape), in place: a piece with a new ``index`` opens
    a call, later pieces of that index append their ``function.arguments``. The message's
    ``tool_calls`` list is ``[calls[k] for k in sorted(calls)]``."""
    for piece in pieces:
        k = piece.get("index", len(calls))
        fn = piece.get("function") or {}
        call = calls.get(k)
        if call is None:
            call = calls[k] = {
                "id": piece.get("id"),
                "type": piece.get("type") or "function",
                "function": {"name": fn.get("name") or "", "arguments": ""},
            }
        if piece.get("id") and not call["id"]:
            call["id"] = piece["id"]
        if fn.get("name") and not call["function"]["name"]:
            call["function"]["name"] = fn["name"]
        call["function"]["arguments"] += fn.get("arguments") or ""
    return calls


def replica_index(model: Any) -> int:
    for tag in model.tags:
        if tag.startswith("replica:"):
            return int(tag.split(":", 1)[1])
    return 0


def replica_name(model: Any) -> str:
    """``name#index`` of one replica's model config (its ``replica:N`` tag)."""
    return f"{model.name}#{replica_index(model)}"


def pop_load_mode(model: Any, options: dict[str, Any], kind: str, takes: str) -> bool:
    """Pop ``load = "start"|"lazy"`` from a model's ``engine`` ``options`` (what the backend has not
    popped yet) and refuse what is left: True when the model loads on its first request."""
    from tokenops.config import ConfigError

    load = options.pop("load", "start")
    if load not in ("start", "lazy") or options:
        bad = f"load = {load!r}" if load not in ("start", "lazy") else ", ".join(sorted(options))
        raise ConfigError(
            f'model {model.name!r}: {kind} models take engine = {{ {takes}, load = "start"|"lazy" }}; got {bad}'
        )
    return load == "lazy"


class LoadOnce:
    """The model of an in-process backend (embedding, diffusion), loaded once: at start, or with
    ``load = "lazy"`` on its first request. Concurrent callers share one load; a lazy load that fails
    is a 503 naming the folder (at start the server reports a failed model as for any other kind)."""

    def __init__(self, model: Any, backend: str, is_lazy: bool, value: Any = None) -> None:
        self.model, self.backend, self.is_lazy = model, backend, is_lazy
        #: the loaded model, None until loaded (and after close)
        self.value = value
        self._lock = asyncio.Lock()

    @property
    def ready(self) -> bool:
        """Routable: loaded, or loaded when first asked."""
        return self.value is not None or self.is_lazy

    async def get(self, load: Callable[[], Any]) -> Any:
        """The model, ``load()`` run on a thread first if it is not loaded yet."""
        async with self._lock:
            if self.value is None:
                try:
                    self.value = await asyncio.to_thread(load)
                except Exception as e:
                    if not self.is_lazy:
                        raise
                    raise BackendError(
                        f"`{self.model.name}` could not be loaded from {self.model.path}: {e}",
                        kind="unavailable",
                        status=503,
                        backend=self.backend,
                    ) from None
        return self.value
