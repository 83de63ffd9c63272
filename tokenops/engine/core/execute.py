"""One engine step's forward: the runner's inputs built from the scheduled chunks, and a failing
batch retried chunk by chunk so that only the request whose chunk still fails is failed
(:class:`tokenops.engine.core.engine.LLMEngine` finishes those with ``error`` set)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.sampling.prompt_logprobs import wants_prompt_logits

if TYPE_CHECKING:
    from tokenops.engine.core.scheduler import ScheduledChunk
    from tokenops.engine.core.sequence import Sequence


def execute_chunks(runner: Any, chunks: list[ScheduledChunk]) -> tuple[Any, list[tuple[Sequence, str]]]:
    """Run ``runner``'s forward over ``chunks``; returns the logits (rows from ``chunk.row``, which this
    sets, ``chunk.num_logits`` of them per chunk) and the sequences whose chunk failed, with why."""
    # a speculative decode chunk is the decode token plus the proposals, with logits at each
    for c in chunks:  # a prompt whose logprobs are asked: logits at every position
        c.num_logits = c.num_tokens if wants_prompt_logits(c.seq) and not c.num_spec_tokens else 1 + c.num_spec_tokens
    inputs = [
        ChunkInput(
            c.seq.token_ids[c.start_pos : c.start_pos + c.num_tokens - c.num_spec_tokens] + c.spec_token_ids,
            c.start_pos,
            c.seq.block_table,
            c.num_logits,
            c.seq.lora,
        )
        for c in chunks
    ]
    row = 0
    for chunk, one in zip(chunks, inputs):
        chunk.row = row
        row += one.num_logits
    try:
        return runner.execute(inputs), []
    except Exception:
        pass  # retried chunk by chunk below to find the request that breaks it
    import torch

    failed, rows = [], []
    for chunk, one in zip(chunks, inputs):
        try:
            rows.append(runner.execute([one]))
        except Exception as e:
            failed.append((chunk.seq, f"{type(e).__name__}: {e}"))
            rows.append(None)
    ok = next((r for r in rows if r is not None), torch.zeros(1, 1))
    logits = torch.cat(
        [r if r is not None else ok[:1].new_zeros((one.num_logits, ok.shape[1])) for r, one in zip(rows, inputs)]
    )
    return logits, failed
