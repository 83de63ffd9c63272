"""The engine's policies as one constructor argument, and the built-in ones.

``LLMEngine(config, policies=EnginePolicies(...))``: the engine calls only what it is given
here, and the defaults are the built-ins, so an engine (and its scheduler and block
manager) runs with no plugin machinery at all. ``tokenops serve`` builds the
:class:`EnginePolicies` from the plugin hooks once, when it builds an engine
(:mod:`tokenops.policy_hooks`); the contracts are in :mod:`tokenops.engine.core.protocols`.

Built in:

- queue orders ``fcfs`` (arrival) and ``priority`` (lower ``priority`` first, then
  arrival, as vLLM);
- proposers ``ngram`` (prompt lookup) and ``draft`` (a draft model), see
  :mod:`tokenops.engine.spec.proposers`, and ``suffix`` (prompt lookup, then a corpus of the model's
  own answers), see :mod:`tokenops.engine.spec.suffix_proposer`;
- the KV policy sink + window (StreamingLLM-style) when ``kv_window_tokens`` is set;
- no weight transform and no compile step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.protocols import (
        KVPolicy,
        ModelCompiler,
        ModelTransform,
        Proposer,
        ProposerFactory,
        ScheduleOrder,
    )
    from tokenops.engine.core.sequence import Sequence


def fcfs_order(waiting: list[Sequence]) -> list[Sequence]:
    """First come, first served."""
    return sorted(waiting, key=lambda s: s.arrival_time)


def priority_order(waiting: list[Sequence]) -> list[Sequence]:
    """Lower ``priority`` value first, then arrival."""
    return sorted(waiting, key=lambda s: (s.priority, s.arrival_time))


def _ngram(config: EngineConfig) -> Proposer:
    from tokenops.engine.spec.proposers import NgramProposer

    return NgramProposer()


def _draft(config: EngineConfig) -> Proposer:
    from tokenops.engine.spec.proposers import DraftModelProposer

    return DraftModelProposer(config)


def _suffix(config: EngineConfig) -> Proposer:
    from tokenops.engine.spec.suffix_proposer import build_suffix_proposer

    return build_suffix_proposer(config)


BUILTIN_SCHEDULE_ORDERS: Mapping[str, ScheduleOrder] = MappingProxyType(
    {"fcfs": fcfs_order, "priority": priority_order}
)
BUILTIN_PROPOSERS: Mapping[str, ProposerFactory] = MappingProxyType(
    {"ngram": _ngram, "draft": _draft, "suffix": _suffix}
)


class SinkWindowPolicy:
    """Sink + window eviction: keep the first ``num_sink_tokens`` and the last ``window``
    tokens' blocks of a decoding sequence, release whole blocks in between.

    Tokens keep their original positions (RoPE uses the true position); an evicted block's
    table entry becomes -1 and the attention mask hides it. Granularity is one block: the
    sink is rounded up and the window kept to whole blocks. Not combined with the draft
    proposer (its cache shares the block tables)."""

    def __init__(self, num_sink_tokens: int, window: int) -> None:
        if num_sink_tokens < 0 or window < 1:
            raise ValueError(f"sink + window policy needs sink >= 0 and window >= 1, got {num_sink_tokens}, {window}")
        self.num_sink_tokens = num_sink_tokens
        self.window = window

    def blocks_to_evict(self, num_tokens: int, block_size: int, block_table: list[int]) -> list[int]:
        """Indices of live blocks wholly after the sink blocks and before the window
        of the next query (which sees positions ``< num_tokens``)."""
        first = -(-self.num_sink_tokens // block_size)  # sink blocks, rounded up
        end = max(0, num_tokens - self.window) // block_size  # blocks ending at or before the window start
        end = min(end, len(block_table) - 1)  # the last block is never evicted
        return [i for i in range(first, end) if block_table[i] >= 0]

    def max_blocks(self, block_size: int) -> int:
        """Most live blocks a decoding sequence holds after eviction."""
        return -(-self.num_sink_tokens // block_size) + -(-self.window // block_size) + 1


def builtin_kv_policy(config: EngineConfig) -> KVPolicy | None:
    """Sink + window when ``config.kv_window_tokens`` is set, else None (keep every block)."""
    if not config.kv_window_tokens:
        return None
    return SinkWindowPolicy(config.kv_sink_tokens, config.kv_window_tokens)


@dataclass(frozen=True, slots=True)
class EnginePolicies:
    """Everything pluggable an engine calls (see the module doc for the defaults).

    ``schedule_orders`` and ``proposers`` are name -> implementation maps:
    ``EngineConfig.schedule_policy`` and ``EngineConfig.speculative`` pick from them (the
    engine checks the names when it is built, and ``schedule_policy`` again when a live
    tunable changes it). ``kv_policy`` None means the built-in one from the config
    (:func:`builtin_kv_policy`). ``transforms`` run in order on the loaded model, before its
    weights are packed; ``compile`` (None: none) right after them, so the runner knows before
    packing whether the forward is compiled (torch.compile is lazy: it traces at the first forward)."""

    schedule_orders: Mapping[str, ScheduleOrder] = field(default_factory=lambda: BUILTIN_SCHEDULE_ORDERS)
    proposers: Mapping[str, ProposerFactory] = field(default_factory=lambda: BUILTIN_PROPOSERS)
    kv_policy: KVPolicy | None = None
    transforms: tuple[ModelTransform, ...] = ()
    compile: ModelCompiler | None = None

    def schedule_order(self, name: str, error: type[Exception] = ValueError) -> ScheduleOrder:
        order = self.schedule_orders.get(name)
        if order is None:
            raise error(
                f"engine schedule_policy {name!r} is unknown; available: {', '.join(sorted(self.schedule_orders))}"
                " (a plugin adds more with tokenops_register_schedule_orders)"
            )
        return order

    def proposer_factory(self, name: str) -> ProposerFactory:
        factory = self.proposers.get(name)
        if factory is None:
            raise ValueError(
                f"engine speculative {name!r} is not a known proposer; available: "
                f"{', '.join(sorted(self.proposers))} (a plugin adds more with tokenops_register_proposers)"
            )
        return factory
