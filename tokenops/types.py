"""Dataclasses shared by the gateway, plugins, engine adapters and telemetry."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

# the typed request fields and the decision record live in tokenops/request_fields.py, the
# declared decision keys (the core's and the plugins') in tokenops/decision_keys.py; named here too
from tokenops.decision_keys import DecisionError as DecisionError
from tokenops.decision_keys import check_decision
from tokenops.request_fields import Decisions as Decisions
from tokenops.request_fields import Hop as Hop
from tokenops.request_fields import OutputFields as OutputFields
from tokenops.request_fields import RouteRecord as RouteRecord
from tokenops.sampling_fields import SamplingFields as SamplingFields


def new_request_id(prefix: str = "req") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class NativeRequest:
    """A request in a wire API other than chat completions, kept for pass-through."""

    api: str  # "messages" (Anthropic)
    path: str  # under the upstream's /v1, e.g. "/messages"
    body: dict[str, Any]
    #: What the chat translation could not carry, as (param, message): a backend that serves
    #: the translation (not the native body) answers 400 with the first.
    untranslatable: list[tuple[str, str]] = field(default_factory=list)

    def check_translatable(self, backend: str) -> None:
        """Raise the 400 (``BackendError``) of the first thing the translation lost, if any."""
        if self.untranslatable:
            param, message = self.untranslatable[0]
            err = BackendError(message, kind="bad_request", status=400, backend=backend)
            err.upstream_message, err.upstream_code, err.param = message, "unsupported_parameter", param  # type: ignore[attr-defined]
            raise err


@dataclass(slots=True)
class GatewayRequest:
    """A normalised chat or completion request as it moves through the pipeline."""

    kind: str  # "chat" | "completion" | "embedding" | "image"
    model: str  # as asked by the client
    body: dict[str, Any]  # the validated OpenAI request body
    messages: list[dict[str, Any]] | None = None  # chat: the OpenAI messages (None for completions)
    prompt: str | list[int] | None = None  # completions: the prompt text or token ids
    tenant: str = "default"  # from the API key ([gateway] api_keys or a managed key); "default" without keys
    api_key_id: str | None = None  # the managed key's id, when a managed key was used
    session_id: str | None = None  # x-session-id header or the body's user, for sticky routing and memory
    stream: bool = False
    max_tokens: int = 256  # the answer's token limit after defaults were applied
    priority: int = 0  # the body's priority extension: lower runs first under the priority schedule policy
    #: "interactive" (API requests: bounded by [gateway] max_queued_*) or "batch" (never counted against them)
    priority_class: str = "interactive"
    batch_id: str | None = None  # the Batch API batch this request is a line of (priority_class "batch")
    id: str = field(default_factory=new_request_id)  # the request id, also in the response and the store
    arrival: float = field(default_factory=time.time)  # unix time the gateway received it
    headers: dict[str, str] = field(default_factory=dict)  # the client's HTTP headers (credentials removed)
    attempts: list[str] = field(default_factory=list)  # models tried so far (fallback)
    #: Decisions of each pipeline step (the keys and types of :class:`Decisions`), copied into the telemetry row.
    decisions: Decisions = field(default_factory=Decisions)
    #: Headers a pipeline step adds to the client's response (e.g. a budget warning).
    response_headers: dict[str, str] = field(default_factory=dict)
    #: The body as the client sent it in another wire API (e.g. Anthropic's ``/v1/messages``),
    #: for upstreams that serve that API as is; ``body`` holds its chat translation.
    native: NativeRequest | None = None
    #: The sampling fields, typed: read from ``body`` once, when the request is made.
    sampling: SamplingFields = None  # type: ignore[assignment]  # None only until __post_init__ fills it
    #: The output fields (logprobs, echo, structured outputs, thinking budgets), typed like ``sampling``.
    output: OutputFields = None  # type: ignore[assignment]  # None only until __post_init__ fills it
    #: ``(prompt tokens, of them from the prefix cache)``, set by a backend that knows them before its
    #: first delta (the bundled engine): Anthropic's ``message_start`` reports them. None: not known.
    prompt_counts: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.sampling is None:
            self.sampling = SamplingFields.from_values(self.body)
        if self.output is None:
            self.output = OutputFields.from_body(self.body)

    def override_sampling(self, **changes: Any) -> None:
        """Change sampling fields after the request was made (a plugin's policy: an ensemble
        samples at its own temperature), in the typed fields and in the body an upstream gets
        alike; a value of None removes the field."""
        import dataclasses

        self.sampling = dataclasses.replace(self.sampling, **changes)
        self._set_body(changes)

    def override_output(self, **changes: Any) -> None:
        """Change output fields after the request was made (the gateway asks for logprobs its
        validators need), in the typed fields and the body alike; None removes the field."""
        import dataclasses

        self.output = dataclasses.replace(self.output, **changes)
        self._set_body(changes)

    def _set_body(self, changes: dict[str, Any]) -> None:
        for name, value in changes.items():
            if value is None:
                self.body.pop(name, None)
            else:
                self.body[name] = value

    def decide(self, key: str, value: Any) -> None:
        """Record what a step decided: ``decisions[key] = value``, refused (``DecisionError``)
        when neither :class:`Decisions` nor a loaded plugin (``tokenops_register_decisions``)
        declares ``key``, or ``value`` is not of its type."""
        check_decision(key, value)
        cast(dict[str, Any], self.decisions)[key] = value  # checked against Decisions just above

    def add_decision(self, key: str, item: Any) -> None:
        """Append ``item`` to the list decision ``key`` (``fallbacks``, ``retries``), checked like :meth:`decide`."""
        self.decide(key, [*cast(dict[str, Any], self.decisions).get(key, ()), item])

    def prompt_text(self) -> str:
        """The request's text, for routers and caches that look at content."""
        if self.messages is not None:
            parts = []
            for m in self.messages:
                c = m.get("content")
                if isinstance(c, list):
                    c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
                parts.append(str(c or ""))
            return "\n".join(parts)
        if isinstance(self.prompt, str):
            return self.prompt
        return ""

    def last_user_message(self) -> str:
        """The text of the last ``user`` message (a completion's prompt): what the user asks
        now, for plugins that should not re-judge the whole conversation on every turn."""
        if self.messages is None:
            return self.prompt if isinstance(self.prompt, str) else ""
        for m in reversed(self.messages):
            if m.get("role") == "user":
                c = m.get("content")
                if isinstance(c, list):
                    return " ".join(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text")
                return str(c or "")
        return ""


@dataclass(slots=True)
class GatewayResponse:
    """A finished (non-streamed, or fully collected) answer."""

    text: str  # choice 0's content
    model: str  # the model that answered
    finish_reason: str | None = "stop"  # stop | length | tool_calls | content_filter
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    token_logprobs: list[float] | None = None  # choice 0's token log-probabilities (cascades' confidence)
    backend: str | None = None  # the replica that answered, e.g. "tokenops-demo#0"
    extra: dict[str, Any] = field(default_factory=dict)  # more choices, votes, samples: plugin-specific extras
    #: Chat only: choice 0's complete tool calls in OpenAI's message shape,
    #: ``[{"id": "call_..", "type": "function", "function": {"name": .., "arguments": "<json text>"}}]``,
    #: or None when the model called no tool (``text`` is then the content). Any backend
    #: fills it: the openai backend copies the upstream's calls, the bundled engine parses
    #: them from the generated text. Other choices carry theirs as ``extra["choices"][i]["tool_calls"]``.
    tool_calls: list[dict[str, Any]] | None = None
    #: Chat only: choice 0's refusal text (OpenAI structured outputs), else None; other
    #: choices carry theirs as ``extra["choices"][i]["refusal"]``.
    refusal: str | None = None
    #: Completion tokens spent thinking (``usage.completion_tokens_details.reasoning_tokens``),
    #: when the backend knows them (bundled engine with a reasoning parser, or the upstream's usage).
    reasoning_tokens: int | None = None


@dataclass(slots=True, frozen=True)
class RouteDecision:
    """Which model answers. ``escalate_to`` makes it a cascade: when the validators'
    lowest score for the answer is below ``min_score``, the pipeline asks the next model
    of ``escalate_to``. ``members`` makes it an ensemble: the pipeline asks every member
    and combines the answers with ``tokenops_ensemble`` (``method`` names how)."""

    model: str  # the model that answers (the first tier of a cascade, the first member of an ensemble)
    reason: str  # why, in words: route_reason in /admin/requests and the store
    router: str | None = None  # the deciding plugin's name (the requests table's router column)
    score: float | None = None  # the router's own number (a win probability, a similarity): decisions.route.score
    escalate_to: tuple[str, ...] = ()  # cascade: the next tiers, cheapest first
    min_score: float | None = None  # cascade: the validators' score below which a tier escalates
    members: tuple[str, ...] = ()  # ensemble: every model asked
    method: str | None = None  # ensemble: vote | best_of_n | moa


@dataclass(slots=True, frozen=True)
class ReasoningBudget:
    """Returned by ``tokenops_reasoning_budget``: how long one request may think.
    ``max_thinking_tokens`` None is unlimited; ``suppress`` lists reflection words
    ("Wait", "Hmm") whose tokens are masked while the model thinks."""

    max_thinking_tokens: int | None = None
    suppress: tuple[str, ...] = ()
    reason: str = ""


@dataclass(slots=True, frozen=True)
class Rejection:
    """Returned by ``tokenops_admit`` to refuse a request."""

    status: int  # 429, 403, 413, ...
    message: str  # the OpenAI-style error message the client gets
    code: str = "rate_limit_exceeded"  # error.code in the answer
    retry_after_s: float | None = None  # sent as Retry-After


class BackendError(RuntimeError):
    """A backend call failed. ``kind`` is one of: error, timeout, overload,
    context_length, bad_request, unavailable."""

    def __init__(self, message: str, kind: str = "error", status: int = 502, backend: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.backend = backend


@dataclass(slots=True, frozen=True)
class BackendOutcome:
    """Passed to ``tokenops_backend_outcome`` after every backend call (breakers, load balancing)."""

    ok: bool
    latency_s: float
    error_kind: str | None = None  # a BackendError kind: error, timeout, overload, context_length, ...
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class TelemetryEvent:
    """``kind`` names the table the DuckDB sink writes: ``requests``,
    ``engine_stats``, ``expert_load``; ``data`` holds the row(s)."""

    kind: str
    data: dict[str, Any] | list[dict[str, Any]]
    ts: float = field(default_factory=time.time)


@dataclass(slots=True)
class EnsembleFollowUp:
    """Returned by ``tokenops_ensemble`` when combining needs one more model call
    (a judge or an aggregator): the pipeline asks ``model`` with ``messages`` and
    ``finish`` turns that answer into the final response."""

    model: str
    messages: list[dict[str, Any]]
    finish: Any  # Callable[[GatewayResponse], GatewayResponse]
    max_tokens: int = 256
