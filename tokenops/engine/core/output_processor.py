"""Turns sampled tokens into text, decides when sequences stop, and builds outputs.

Stop rules, checked after every token: EOS (unless ``ignore_eos``) and
``stop_token_ids`` end the sequence without adding the token's text; a stop string
ends it with the text cut just before the string; ``max_tokens`` or reaching the
model's context ends it with ``finish_reason="length"``. A sequence under a grammar
advances its matcher with every token (a token the grammar refuses fails the
request) and stops (``"stop"``) as soon as the grammar is complete. While a sequence runs, the
last ``len(longest stop string) - 1`` characters are held back from the streamed
text, so a client never sees the start of a stop string that later completes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tokenops.engine.core.outputs import CompletionOutput, RequestOutput
from tokenops.engine.core.sequence import Sequence
from tokenops.engine.sampling.sampling import SampledToken, SamplingParams


def new_detokenizer(tokenizer: Any) -> Any:
    """An incremental detokenizer for one sequence."""
    from tokenops.engine.core.tokenizer import IncrementalDetokenizer

    return IncrementalDetokenizer(tokenizer, skip_special_tokens=True)


@dataclass(slots=True)
class RequestState:
    """The engine's view of one request: its ``n`` sequences and timings."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    seqs: list[Sequence] = field(default_factory=list)
    first_token_time: float | None = None
    finished_time: float | None = None
    error: str | None = None

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.seqs) and not any(s.num_pending_forks for s in self.seqs)


class OutputProcessor:
    """Appends tokens to sequences and reports them as :class:`RequestOutput`."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._eos_token_ids = frozenset(getattr(tokenizer, "eos_token_ids", ()) or ())

    def append_token(self, seq: Sequence, sampled: SampledToken) -> None:
        """Add one sampled token to ``seq`` and set ``finish_reason`` if it must stop."""
        params, token_id = seq.params, sampled.token_id
        if seq.grammar is not None and not seq.grammar.accept(token_id):
            raise ValueError(f"token {token_id} breaks the request's grammar: {seq.grammar.error}")
        seq.token_ids.append(token_id)
        if seq.thinking is not None:
            seq.thinking.accept(token_id)
        if seq.logprobs is not None:
            seq.logprobs.append(self.logprob_entry(sampled))
        is_short = seq.num_output_tokens < params.min_tokens  # no stop rule ends it yet (vLLM's min_tokens)
        if not params.ignore_eos and token_id in self._eos_token_ids and not is_short:
            seq.finish_reason = "stop"
        elif token_id in params.stop_token_ids and not is_short:
            seq.finish_reason, seq.stop_reason = "stop", token_id
        else:
            if seq.detokenizer is None:
                seq.detokenizer = new_detokenizer(self.tokenizer)
            num_old_chars = len(seq.text)
            seq.text += seq.detokenizer.push(token_id)
            if params.stop and not is_short:
                self._check_stop_strings(seq, num_old_chars)
        if seq.finish_reason is None and seq.grammar is not None and seq.grammar.is_finished:
            seq.finish_reason = "stop"  # only end-of-sequence could follow: save the step
        if seq.finish_reason is None and (
            seq.num_output_tokens >= params.max_tokens or len(seq.token_ids) >= self.max_model_len
        ):
            seq.finish_reason = "length"
            flush = getattr(seq.detokenizer, "flush", None)
            if flush is not None:  # an unfinished UTF-8 character at the end becomes U+FFFD
                seq.text += flush()

    def _check_stop_strings(self, seq: Sequence, num_old_chars: int) -> None:
        longest = max(len(s) for s in seq.params.stop)
        start = max(0, num_old_chars - longest + 1)
        best: tuple[int, str] | None = None
        for stop in seq.params.stop:
            at = seq.text.find(stop, start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        if best is not None:
            seq.text = seq.text[: best[0]]
            seq.finish_reason, seq.stop_reason = "stop", best[1]

    def logprob_entry(self, sampled: SampledToken) -> dict:
        # the token's own text (" hello"), as OpenAI reports it; the vocab entry otherwise
        token = getattr(self.tokenizer, "token_text", None) or self.tokenizer.id_to_token
        return {
            "token_id": sampled.token_id,
            "token": token(sampled.token_id),
            "logprob": sampled.logprob,
            "top": [{"token_id": t, "token": token(t), "logprob": lp} for t, lp in sampled.top or []],
        }

    def make_output(self, state: RequestState) -> RequestOutput:
        """The request's output now, with the deltas since the previous call."""
        completions = []
        for seq in sorted(state.seqs, key=lambda s: s.output_index):
            visible = len(seq.text)
            if seq.finish_reason is None and seq.params.stop:
                visible = max(seq.num_emitted_chars, visible - (max(len(s) for s in seq.params.stop) - 1))
            output_ids = seq.output_token_ids
            completions.append(
                CompletionOutput(
                    index=seq.output_index,
                    text=seq.text[:visible],
                    token_ids=output_ids,
                    delta_text=seq.text[seq.num_emitted_chars : visible],
                    delta_token_ids=output_ids[seq.num_emitted_tokens :],
                    logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
                    finish_reason=seq.finish_reason,
                    stop_reason=seq.stop_reason,
                    num_reasoning_tokens=seq.thinking.num_reasoning_tokens if seq.thinking is not None else 0,
                    thinking_closed_by=seq.thinking.closed_by if seq.thinking is not None else None,
                    thinking_first_pass=seq.thinking.num_first_pass if seq.thinking is not None else None,
                    thinking_spent=seq.thinking.num_spent if seq.thinking is not None else None,
                )
            )
            seq.num_emitted_chars = visible
            seq.num_emitted_tokens = len(output_ids)
        is_finished = state.is_finished
        prompt_logprobs = next((s.prompt_logprobs for s in state.seqs if s.output_index == 0), None)
        if is_finished and state.finished_time is None:
            state.finished_time = time.time()
        return RequestOutput(
            request_id=state.request_id,
            prompt_token_ids=state.prompt_token_ids,
            num_cached_tokens=min((s.num_cached_tokens for s in state.seqs), default=0),
            outputs=completions,
            finished=is_finished,
            arrival_time=state.arrival_time,
            first_token_time=state.first_token_time,
            finished_time=state.finished_time,
            error=state.error,
            prompt_logprobs=list(prompt_logprobs) if prompt_logprobs is not None else None,
            first_scheduled_time=min(
                (s.first_scheduled_time for s in state.seqs if s.first_scheduled_time is not None), default=None
            ),
        )
