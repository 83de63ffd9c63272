"""Benchmark requests and the workload registry.

A workload is a factory registered through ``tokenops_register_workloads``:
``factory(num_requests=..., seed=..., **options)`` returns a list of
:class:`BenchRequest`. Factories ignore options that are not theirs, so one
option set (the CLI's) can be passed to any workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

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


def get_workloads() -> dict[str, WorkloadFactory]:
    """Every registered workload by name."""
    from tokenops.plugins import get_plugin_manager

    found: dict[str, WorkloadFactory] = {}

    def register(name: str, factory: WorkloadFactory) -> None:
        if name in found:
            raise WorkloadError(f"workload {name!r} is registered twice")
        found[name] = factory

    get_plugin_manager().hook.tokenops_register_workloads(register=register)
    return found


def build_workload(name: str, num_requests: int, seed: int = 0, **options: Any) -> list[BenchRequest]:
    """Build ``num_requests`` requests of workload ``name``."""
    if num_requests < 1:
        raise WorkloadError(f"--num-requests must be >= 1, got {num_requests}")
    workloads = get_workloads()
    if name not in workloads:
        raise WorkloadError(f"unknown workload {name!r}; available: {', '.join(sorted(workloads)) or 'none'}")
    requests = workloads[name](num_requests=num_requests, seed=seed, **options)
    if not requests:
        raise WorkloadError(f"workload {name!r} produced no requests")
    return list(requests)
