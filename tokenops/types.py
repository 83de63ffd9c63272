"""Dataclasses shared by the gateway, plugins, engine adapters and telemetry."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, TypedDict


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


class RouteRecord(TypedDict):
    """``decisions["route"]``: the router's choice."""

    model: str
    reason: str
    router: str | None
    score: float | None


#: One move of a request: a fallback to another model, a retry on another replica, a degradation
#: to a smaller model (``from``/``to`` name models or replicas). Functional form: ``from`` is a keyword.
Hop = TypedDict("Hop", {"from": str, "to": str, "error": str, "reason": str}, total=False)


class Decisions(TypedDict, total=False):
    """What each step decided for one request: the keys the core and the built-in plugins write
    into ``GatewayRequest.decisions`` and their types. A plain dict at run time, so the store's
    ``decisions`` JSON keeps its shape (old rows included); a type checker holds every writer
    and reader to these names and types. A third-party plugin may add a key of its own."""

    api: str  # "messages" | "responses": the wire API the client spoke (absent: chat/completions)
    admit: dict[str, str]  # {"rejected": code} when admission refused
    rate_limit: str  # "admitted" | "queued:<s>s" | "rejected:<why>"
    budget: str | dict[str, float]  # "refused:<scope>" or {"reserved_usd": estimate}
    budget_warning: str  # a soft budget was passed (also a response header)
    cache: str  # "hit" | "miss"
    semantic_cache: dict[str, Any]  # the semantic cache's lookup: result, similarity, ...
    route: RouteRecord
    memory: Any  # what session memory did to the context (tokenops.memory.fit)
    replica: str  # the replica chosen
    replica_policy: str  # why the selector chose it
    breaker: dict[str, Any]  # {"excluded": [replicas an open breaker kept out]}
    degraded: Hop  # sent to a smaller model while the asked one is down
    fallbacks: list[Hop]  # models tried after a failure (tokenops_fallback)
    retries: list[Hop]  # replicas retried after a failure
    validate: float  # the lowest validator score
    logprobs_for_validation: bool  # logprobs asked for the validators, hidden from the client
    escalated: bool  # a cascade went past its first model
    cascade: dict[str, Any]  # {"min_score", "steps": [{"model", "score"}]}
    ensemble: dict[str, Any]  # members, method, failures, member costs, follow-up
    reasoning_budget: dict[str, Any]  # the thinking budget given (max_thinking_tokens, suppress, reason)
    reasoning_features: dict[str, Any]  # what the adaptive budget policy saw
    thinking: dict[str, list[Any]]  # per choice: closed_by, first_pass, spent
    stop_sequence: str  # the stop string that ended choice 0 (Anthropic's stop_sequence)
    image: dict[str, Any]  # an image request's plan and sizes


@dataclass(frozen=True, slots=True)
class SamplingFields:
    """The sampling fields of a request as the client sent them, read once from the validated
    body when the :class:`GatewayRequest` is made; None (or empty) where the client sent none.
    Backends read these fields, not the body."""

    n: int | None = None  # choices asked
    temperature: float | None = None  # None: the backend's default (1.0 on the bundled engine)
    top_p: float | None = None  # nucleus sampling mass
    top_k: int | None = None  # the ``top_k`` extension (vLLM's); 0 or None: off
    seed: int | None = None  # a per-request seed for reproducible sampling
    stop: tuple[str, ...] = ()  # stop strings (a single string becomes one)
    ignore_eos: bool = False  # the ``ignore_eos`` extension: generate up to max_tokens
    #: whether the client set ``max_tokens`` or ``max_completion_tokens`` (the limit itself,
    #: after the server's default, is ``GatewayRequest.max_tokens``)
    is_max_tokens_sent: bool = False

    @classmethod
    def from_body(cls, body: dict[str, Any], sent: set[str] | None = None) -> SamplingFields:
        """The fields of ``body``; with ``sent`` (the names the client's JSON held, as the
        schema saw them) a value the schema filled in by default counts as not sent."""
        if sent is not None:
            body = {k: v for k, v in body.items() if k in sent}
        stop = body.get("stop")
        return cls(
            n=body.get("n"),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            top_k=body.get("top_k"),
            seed=body.get("seed"),
            stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
            ignore_eos=bool(body.get("ignore_eos")),
            is_max_tokens_sent=body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None,
        )

    def sent(self) -> set[str]:
        """The names of the fields the client sent (for decisions and logs)."""
        out = {name for name in ("n", "temperature", "top_p", "top_k", "seed") if getattr(self, name) is not None}
        out |= {"stop"} if self.stop else set()
        out |= {"ignore_eos"} if self.ignore_eos else set()
        return out | ({"max_tokens"} if self.is_max_tokens_sent else set())


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

    def __post_init__(self) -> None:
        if self.sampling is None:
            self.sampling = SamplingFields.from_body(self.body)

    def override_sampling(self, **changes: Any) -> None:
        """Change sampling fields after the request was made (a plugin's policy: an ensemble
        samples at its own temperature), in the typed fields and in the body an upstream gets
        alike; a value of None removes the field."""
        import dataclasses

        self.sampling = dataclasses.replace(self.sampling, **changes)
        for name, value in changes.items():
            if value is None:
                self.body.pop(name, None)
            else:
                self.body[name] = value

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
