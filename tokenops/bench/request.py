"""One benchmark request (:class:`BenchRequest`) and the error a workload raises: what every
workload module and the load generator share (the registry is :mod:`tokenops.bench.workloads`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

WorkloadFactory = Callable[..., list["BenchRequest"]]


class WorkloadError(ValueError):
    """A workload could not be built; the message says why and what to do."""


@dataclass(slots=True)
class BenchRequest:
    """One request of a workload (or the first turn of a conversation)."""

    messages: list[dict[str, str]]
    max_tokens: int
    #: Expected prompt tokens (the server's usage report is authoritative).
    num_prompt_tokens: int | None = None
    #: Fixed send time from the run start (replay); None follows the arrival process.
    arrival_s: float | None = None
    #: Later user turns of a multi-turn conversation, each sent after the previous answer.
    followups: list[str] = field(default_factory=list)
    followup_max_tokens: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise WorkloadError(f"max_tokens must be >= 1, got {self.max_tokens}")
        assert len(self.followups) == len(self.followup_max_tokens)

    @property
    def num_turns(self) -> int:
        return 1 + len(self.followups)

    def prompt_text(self) -> str:
        """The messages joined, for the plain completions endpoint."""
        return "\n".join(m["content"] for m in self.messages)
