"""Per-sequence request state: tokens, KV block table, status and output bookkeeping.

One request with ``n > 1`` becomes ``n`` sequences that share the request id and
differ by ``output_index``.
"""

from __future__ import annotations

import enum
import itertools
import time
from typing import Any

from tokenops.engine.sampling.sampling import SamplingParams

_seq_ids = itertools.count()

#: Priority classes: the scheduler admits waiting interactive sequences before any batch one and
#: preempts running batch sequences to make room for them (tokenops/engine/core/scheduler.py).
INTERACTIVE, BATCH = "interactive", "batch"
PRIORITY_CLASSES = (INTERACTIVE, BATCH)


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """The state of one generated sequence.

    Tokens ``[0, num_computed_tokens)`` have their K/V in the cache; the
    remaining ``len(token_ids) - num_computed_tokens`` are scheduled as prefill
    chunks (or as the single decode token).
    """

    __slots__ = (
        "seq_id",
        "request_id",
        "tenant",
        "priority",
        "priority_class",
        "arrival_time",
        "params",
        "output_index",
        "token_ids",
        "num_prompt_tokens",
        "num_computed_tokens",
        "num_cached_tokens",
        "block_table",
        "block_hashes",
        "status",
        "generator",
        "logprobs",
        "detokenizer",
        "text",
        "num_emitted_tokens",
        "num_emitted_chars",
        "finish_reason",
        "stop_reason",
        "num_pending_forks",
        "first_token_time",
        "error",
        "grammar",
        "first_scheduled_time",
        "thinking",
        "prompt_logprobs",
        "lora",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tenant: str = "default",
        priority: int = 0,
        arrival_time: float | None = None,
        output_index: int = 0,
        priority_class: str = INTERACTIVE,
    ) -> None:
        assert prompt_token_ids, "a sequence needs at least one prompt token"
        assert priority_class in PRIORITY_CLASSES, priority_class
        self.seq_id = next(_seq_ids)
        self.request_id = request_id
        self.tenant = tenant
        #: the LoRA adapter this sequence runs with (None: the base model)
        self.lora: str | None = None
        self.priority = priority
        self.priority_class = priority_class
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.params = params
        self.output_index = output_index
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        #: Prompt tokens served from the prefix cache at the last admission.
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        #: Chained hashes of this sequence's full blocks, filled lazily (tokens never change).
        self.block_hashes: list[int] = []
        self.status = SequenceStatus.WAITING
        self.generator: Any = None  # torch.Generator when params.seed is set
        self.logprobs: list[dict] | None = [] if params.logprobs is not None else None
        self.detokenizer: Any = None
        self.text = ""
        self.num_emitted_tokens = 0
        self.num_emitted_chars = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        #: Siblings still to be forked from this sequence once its prompt is computed (n > 1).
        self.num_pending_forks = params.n - 1
        self.first_token_time: float | None = None
        #: ``time.time()`` when the scheduler first admitted it (the end of its queue time).
        self.first_scheduled_time: float | None = None
        self.error: str | None = None
        #: This sequence's own grammar matcher (a copy of ``params.grammar``), advanced per token.
        self.grammar: Any = params.grammar.copy() if params.grammar is not None else None
        #: This sequence's :class:`tokenops.engine.sampling.thinking.ThinkingState` (budget forcing), or None.
        self.thinking: Any = params.thinking.new_state() if params.thinking is not None else None
        #: Logprob entries of the prompt's tokens (``params.prompt_logprobs``), the first None; filled by
        #: :mod:`tokenops.engine.sampling.prompt_logprobs` as the prefill runs.
        self.prompt_logprobs: list[dict | None] | None = [None] if params.prompt_logprobs is not None else None

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id}#{self.output_index}, {self.status.value}, "
            f"tokens={len(self.token_ids)}, computed={self.num_computed_tokens})"
        )

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_batch(self) -> bool:
        """Batch work (the Batch API's lines): runs on what interactive requests leave idle."""
        return self.priority_class == BATCH

    @property
    def is_prefill(self) -> bool:
        """More than the one decode token is left to compute."""
        return self.num_uncomputed_tokens > 1

    @property
    def cache_salt(self) -> str:
        """What the prefix cache keys blocks by besides tokens: the tenant, and the LoRA adapter
        (two adapters never share KV: the same tokens give different keys and values)."""
        return self.tenant if self.lora is None else f"{self.tenant}\x00lora:{self.lora}"

    def fork(self, output_index: int) -> Sequence:
        """A sibling with the same tokens and computed state; blocks are shared by the
        block manager, not here."""
        child = Sequence(
            self.request_id,
            self.token_ids[: self.num_prompt_tokens],
            self.params,
            self.tenant,
            self.priority,
            self.arrival_time,
            output_index,
            self.priority_class,
        )
        child.token_ids = list(self.token_ids)
        child.lora = self.lora
        child.num_computed_tokens = self.num_computed_tokens
        child.num_cached_tokens = self.num_cached_tokens
        child.block_hashes = list(self.block_hashes)
        child.status = self.status
        child.num_pending_forks = 0
        child.prompt_logprobs = self.prompt_logprobs  # complete by now: the request reports the parent's
        return child
