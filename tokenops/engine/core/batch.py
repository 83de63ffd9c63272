"""What one engine step asks the model to compute.

:class:`ChunkInput` is the interface between the scheduler and the model runner:
one entry per scheduled sequence, holding either a prefill chunk or the single
token of a decode step, plus the physical KV blocks that cover the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ChunkInput:
    """The tokens of one sequence computed in one step.

    :param token_ids: tokens computed this step (a prefill chunk, or the one decode token).
    :param start_pos: tokens of this sequence already in the KV cache; the chunk's
        positions are ``start_pos .. start_pos + len(token_ids) - 1``.
    :param block_table: physical block ids covering positions
        ``[0, start_pos + len(token_ids))`` (more entries are allowed).
    :param num_logits: logits rows wanted for this chunk: those of its last
        ``num_logits`` tokens (1 normally; ``1 + k`` when a speculative decode chunk
        verifies ``k`` proposed tokens).
    :param lora: the LoRA adapter (by name) the chunk runs with; None is the base model.
    """

    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    num_logits: int = 1
    lora: str | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("ChunkInput needs at least one token")
        if self.start_pos < 0:
            raise ValueError(f"ChunkInput.start_pos must be >= 0, got {self.start_pos}")
        if not 1 <= self.num_logits <= len(self.token_ids):
            raise ValueError(f"ChunkInput.num_logits must be in [1, {len(self.token_ids)}], got {self.num_logits}")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end_pos(self) -> int:
        """Number of tokens in the cache once this chunk is written."""
        return self.start_pos + len(self.token_ids)

    @property
    def is_decode(self) -> bool:
        """One new token with context already cached: batched with the other decodes."""
        return len(self.token_ids) == 1 and self.start_pos > 0
