"""What the engine hands back per step and at the end of a request."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    """One of the ``n`` completions of a request; ``text``/``token_ids`` hold all so far,
    ``delta_*`` what this step added."""

    index: int
    text: str
    token_ids: list[int]
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    #: All so far: ``{"token_id", "token", "logprob", "top": [{"token_id", "token", "logprob"}]}``.
    logprobs: list[dict] | None = None
    finish_reason: str | None = None  # None | "stop" | "length" | "abort"
    #: The stop string or stop token id that ended it (None for EOS or length).
    stop_reason: str | int | None = None
    #: Tokens of the thinking block so far (tags included), when the request has thinking control.
    num_reasoning_tokens: int = 0
    #: How the thinking block ended: "model", "budget", or None (open, or no thinking control).
    thinking_closed_by: str | None = None
    #: Content tokens of the block's first pass (before the first reflection token or the
    #: model's own close), when known.
    thinking_first_pass: int | None = None
    #: Content tokens of the block (tags and forced tokens excluded), when there is thinking control.
    thinking_spent: int | None = None


@dataclass(slots=True)
class RequestOutput:
    """A request's state after an engine step (times are ``time.time()`` seconds)."""

    request_id: str
    prompt_token_ids: list[int]
    num_cached_tokens: int
    outputs: list[CompletionOutput]
    finished: bool
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    #: When the scheduler first admitted any of its sequences (queue time = this - arrival_time).
    first_scheduled_time: float | None = None
    #: Set when the engine failed this request (it finishes with ``finish_reason="abort"``).
    error: str | None = None
    #: ``SamplingParams.prompt_logprobs``: one entry per prompt token (the first None), shaped as
    #: ``CompletionOutput.logprobs`` entries; all of them once the prompt is computed.
    prompt_logprobs: list[dict | None] | None = None

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)
