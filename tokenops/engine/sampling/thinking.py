"""Thinking-block control for one sequence: counting and budget forcing.

Mechanism only (which budget a request gets is policy: the ``tokenops_reasoning_budget``
hook). A sequence whose ``SamplingParams.thinking`` is set tracks whether it is inside
its first thinking block (between the ``open_ids`` and ``close_ids`` token runs, e.g.
``<think>`` … ``</think>``) and how many tokens that block holds. When the block has
spent ``budget`` tokens, the sampler forces the closing run for that row (preceded by a
line break when the last token did not end a line), then the model answers on its own:
budget forcing; the budget is spent *before* the answer, not instead of it, so until the
first answer token after a forced close the ``eos_ids`` are masked (a model trained to
always think ends its turn at once after a block it did not close itself, which left a
``reasoning_effort: "none"`` request with an empty answer). While thinking, ``suppress_ids`` (reflection words such as "Wait") are
masked from the logits. For telemetry the state also notes how the block ended (the model
closed it, or the budget did) and how many tokens its first pass took (the content before
the first ``reflection_ids`` token): what a policy learning budgets from traffic needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class ThinkingControl:
    """A request's thinking controls (shared by its sequences; each gets a :class:`ThinkingState`)."""

    open_ids: tuple[int, ...]
    close_ids: tuple[int, ...]
    #: Most tokens the block may hold (after the opening run) before it is closed; None: unlimited.
    budget: int | None = None
    #: Token ids masked while thinking (reflection suppression).
    suppress_ids: tuple[int, ...] = ()
    #: Forced before ``close_ids`` when the last token is not in ``line_end_ids``.
    newline_ids: tuple[int, ...] = ()
    line_end_ids: frozenset[int] = field(default_factory=frozenset)
    #: The prompt already opened the block (templates that end with ``<think>``).
    starts_thinking: bool = False
    #: Token ids that start a re-check (counted, not masked): they end the first pass.
    reflection_ids: frozenset[int] = field(default_factory=frozenset)
    #: End-of-turn ids, masked after a forced close until the answer has begun.
    eos_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        assert self.open_ids and self.close_ids, "thinking tags need token ids"
        if self.budget is not None and (
            isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 0
        ):
            raise ValueError(f"the thinking budget must be an integer >= 0, got {self.budget!r}")

    def new_state(self) -> ThinkingState:
        return ThinkingState(self)


class ThinkingState:
    """Where one sequence is with respect to its thinking block."""

    __slots__ = (
        "control",
        "is_thinking",
        "is_done",
        "num_reasoning_tokens",
        "num_spent",
        "forced",
        "num_forced",
        "num_first_pass",
        "is_answer_pending",
        "_tail",
    )

    def __init__(self, control: ThinkingControl) -> None:
        self.control = control
        self.is_thinking = control.starts_thinking
        self.is_done = False
        #: Tokens of the block, both tags included (what usage reports as reasoning tokens).
        self.num_reasoning_tokens = 0
        #: Tokens counted against the budget (the block's content).
        self.num_spent = 0
        #: Token ids still to force, in order.
        self.forced: list[int] = []
        self.num_forced = 0
        #: Content tokens before the first reflection token (or before the model's own close);
        #: None until one of them happens.
        self.num_first_pass: int | None = None
        #: The budget closed the block and no answer token has come yet (end of turn masked).
        self.is_answer_pending = False
        self._tail: list[int] = []
        if control.starts_thinking and control.budget == 0:
            self.forced = list(control.close_ids)

    @property
    def forced_token(self) -> int | None:
        return self.forced[0] if self.forced else None

    @property
    def is_suppressing(self) -> bool:
        return self.is_thinking and bool(self.control.suppress_ids) and not self.forced

    def accept(self, token_id: int) -> None:
        """Advance with the token just appended to the sequence."""
        c = self.control
        if self.forced and token_id == self.forced[0]:
            self.forced.pop(0)
            self.num_forced += 1
        self._tail = (self._tail + [token_id])[-max(len(c.open_ids), len(c.close_ids)) :]
        if self.is_done:
            if self.is_answer_pending and token_id not in c.line_end_ids and token_id not in c.eos_ids:
                self.is_answer_pending = False
            return
        if not self.is_thinking:
            if tuple(self._tail[-len(c.open_ids) :]) == c.open_ids:
                self.is_thinking = True
                self.num_reasoning_tokens += len(c.open_ids)
                if c.budget == 0:
                    self.force_close()
            return
        self.num_reasoning_tokens += 1
        if tuple(self._tail[-len(c.close_ids) :]) == c.close_ids:
            self.is_thinking, self.is_done, self.forced = False, True, []
            self.is_answer_pending = bool(self.num_forced and c.eos_ids)
            if self.num_first_pass is None and not self.num_forced:
                self.num_first_pass = self.num_spent
            return
        if not self.forced:
            if self.num_first_pass is None and token_id in c.reflection_ids:
                self.num_first_pass = self.num_spent
            self.num_spent += 1
            if c.budget is not None and self.num_spent >= c.budget:
                self.force_close()

    @property
    def closed_by(self) -> str | None:
        """``"model"`` (it wrote the close itself), ``"budget"`` (forced) or None (still open)."""
        if not self.is_done:
            return None
        return "budget" if self.num_forced else "model"

    def force_close(self) -> None:
        """Queue the closing run (the budget is spent, or the block must end now)."""
        c = self.control
        needs_break = c.newline_ids and self._tail and self._tail[-1] not in c.line_end_ids
        self.forced = [*(c.newline_ids if needs_break else ()), *c.close_ids]


def apply_thinking(logits, rows: list[int], states: list[ThinkingState]):
    """``logits`` with forced rows reduced to their forced token and suppressing rows
    without their reflection tokens (``rows[j]`` is the logits row of ``states[j]``)."""
    forced = [(i, s.forced_token) for i, s in zip(rows, states) if s.forced_token is not None]
    masked = [(i, s.control.suppress_ids) for i, s in zip(rows, states) if s.is_suppressing]
    masked += [(i, s.control.eos_ids) for i, s in zip(rows, states) if s.is_answer_pending]
    if not forced and not masked:
        return logits
    logits = logits.clone()
    for i, token_id in forced:
        keep = logits[i, token_id].clone()
        logits[i] = float("-inf")
        logits[i, token_id] = keep if keep.isfinite() else 0.0
    for i, ids in masked:
        logits[i, list(ids)] = float("-inf")
    return logits
