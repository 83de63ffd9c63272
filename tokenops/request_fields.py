"""The typed parts of a request: its sampling and output fields, read once from the validated body
(with whether the client sent each), and the declared keys of its decision record, checked when
written. :mod:`tokenops.types` re-exports them; backends and plugins read these, not the body
(the body stays for the schema and for upstreams that get it forwarded unchanged)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from tokenops.sampling_fields import REGISTRY

#: The body's sampling fields (:class:`SamplingFields`) and output fields (:class:`OutputFields`):
#: ``tests/test_typed_request.py`` fails when code in ``tokenops/backends/`` or the plugins reads
#: one of these names from a body dict.
SAMPLING_NAMES = (*(f.name for f in REGISTRY), "max_tokens", "max_completion_tokens")
OUTPUT_NAMES = (
    "logprobs",
    "top_logprobs",
    "echo",
    "stream_options",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "max_thinking_tokens",
)


def _sent_only(body: dict[str, Any], sent: set[str] | None) -> dict[str, Any]:
    return body if sent is None else {k: v for k, v in body.items() if k in sent}


@dataclass(frozen=True, slots=True)
class OutputFields:
    """What the client asked the answer to carry or look like, read once from the validated body
    like :class:`SamplingFields`: logprobs, echo, usage in the stream, structured outputs and tool
    calls, thinking budgets. None (or False) where the client sent none."""

    #: chat: whether to return the sampled tokens' logprobs (a bool); completions: how many
    #: alternatives per token (an int, 0 for the sampled token's alone)
    logprobs: bool | int | None = None
    top_logprobs: int | None = None  # chat: alternatives per token (needs ``logprobs: true``)
    echo: bool = False  # completions: the prompt comes back before the answer
    include_usage: bool = False  # ``stream_options.include_usage``: a last chunk with the usage
    response_format: dict[str, Any] | None = None  # text, json_object or json_schema (checked by the schema)
    tools: list[dict[str, Any]] | None = None  # the functions the model may call (checked by the schema)
    tool_choice: str | dict[str, Any] | None = None  # none | auto | required | a named function
    parallel_tool_calls: bool | None = None  # whether one answer may hold several calls
    #: OpenAI's ``reasoning_effort`` as sent (the backend that acts on it checks the value)
    reasoning_effort: object = None
    #: the ``max_thinking_tokens`` extension as sent (the backend that acts on it checks the value)
    max_thinking_tokens: object = None

    @classmethod
    def from_body(cls, body: dict[str, Any], sent: set[str] | None = None) -> OutputFields:
        """The fields of ``body`` (a validated body or a request model's attributes); with ``sent``
        (the names the client's JSON held) a value a schema filled in by default counts as not sent."""
        body = _sent_only(body, sent)
        options = body.get("stream_options")
        return cls(
            logprobs=body.get("logprobs"),
            top_logprobs=body.get("top_logprobs"),
            echo=bool(body.get("echo")),
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
            response_format=body.get("response_format"),
            tools=body.get("tools"),
            tool_choice=body.get("tool_choice"),
            parallel_tool_calls=body.get("parallel_tool_calls"),
            reasoning_effort=body.get("reasoning_effort"),
            max_thinking_tokens=body.get("max_thinking_tokens"),
        )

    def wants_logprobs(self, kind: str) -> bool:
        """Whether the answer carries logprobs: chat's ``logprobs: true``, a completion's ``logprobs`` set."""
        return bool(self.logprobs) if kind == "chat" else self.logprobs is not None


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
    """What each step of the core decided for one request: the keys the core writes into
    ``GatewayRequest.decisions`` and their types. Plugins declare their own keys through
    ``tokenops_register_decisions`` (:mod:`tokenops.decision_keys`), built-ins as third-party ones.
    A plain dict, so the store's ``decisions`` JSON keeps its shape (old rows included); every
    writer goes through ``GatewayRequest.decide`` (or ``add_decision`` for the lists), which
    refuses an undeclared key or a value of the wrong basic type."""

    api: str  # "messages" | "responses": the wire API the client spoke (absent: chat/completions)
    admit: dict[str, str]  # {"rejected": code} when admission refused
    rate_limit: str  # "admitted" | "queued:<s>s" | "rejected:<why>" (the rate limiter, tokenops.ratelimit)
    budget: str | dict[str, float]  # "refused:<scope>" or {"reserved_usd": estimate} (tokenops.keys)
    budget_warning: str  # a soft budget was passed (also a response header)
    cache: str  # "hit" | "miss"
    route: RouteRecord
    memory: Any  # what session memory did to the context (tokenops.memory.fit)
    replica: str  # the replica chosen
    replica_policy: str  # why the selector chose it
    fallbacks: list[Hop]  # models tried after a failure (tokenops_fallback)
    retries: list[Hop]  # replicas retried after a failure
    validate: float  # the lowest validator score
    logprobs_for_validation: bool  # logprobs asked for the validators, hidden from the client
    escalated: bool  # a cascade went past its first model
    cascade: dict[str, Any]  # {"min_score", "steps": [{"model", "score"}]}
    ensemble: dict[str, Any]  # members, method, failures, member costs, follow-up
    reasoning_budget: dict[str, Any]  # the thinking budget given (max_thinking_tokens, suppress, reason)
    thinking: dict[str, list[Any]]  # per choice: closed_by, first_pass, spent
    stop_sequence: str  # the stop string that ended choice 0 (Anthropic's stop_sequence)
    tool_call_gate: dict[str, Any]  # the free-call confidence gate: threshold, judged calls, answered again
    image: dict[str, Any]  # an image request's plan and sizes
