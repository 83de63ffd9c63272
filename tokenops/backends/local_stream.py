"""The bundled engine's outputs turned into the gateway's deltas, for the ``local`` backend.

:class:`ChoiceStreams` holds what one request's stream remembers per choice (tokens already sent,
the finish already sent, the reasoning and tool-call splitters) and makes each engine output into
:class:`~tokenops.backends.base.Delta` s in OpenAI's shapes; the last delta carries the usage and
timings. Kept apart from :mod:`tokenops.backends.local` (which prepares the request and runs the
engine) because this is the half that knows the wire shapes.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from tokenops.backends.base import Delta
from tokenops.backends.local_fields import echo_delta
from tokenops.backends.reasoning_parsers import ReasoningParser, ReasoningSplitter
from tokenops.backends.tool_confidence import CallConfidence
from tokenops.types import BackendError, GatewayRequest

log = logging.getLogger("tokenops.backends")


@dataclass
class ChoiceStreams:
    """One request's stream state, choice by choice (``index`` -> ...)."""

    request: GatewayRequest
    prompt_ids: list[int]
    params: Any  # the request's SamplingParams (``thinking`` set for a reasoning model)
    plan: Any  # the structured-output plan (tools, grammar), or None
    reasoning_parser: ReasoningParser | None
    tokenizer: Any
    seen: dict[int, int] = field(default_factory=dict)  # tokens already sent
    sent_finish: set[int] = field(default_factory=set)
    num_reasoning: dict[int, int] = field(default_factory=dict)
    reasoning_streams: dict[int, ReasoningSplitter] = field(default_factory=dict)
    tool_streams: dict[int, Any] = field(default_factory=dict)  # ToolCallStream (when tools are on)
    #: completions' ``echo``: the choices whose prompt was sent (None: no echo)
    echoed: set[int] | None = None
    #: the confidence gate for free calls (tokenops/backends/tool_confidence.py): its threshold (0: off)
    gate_threshold: float = 0.0
    show_logprobs: bool = True  # False: the engine's logprobs are the gate's, not the client's
    confidences: dict[int, CallConfidence] = field(default_factory=dict)
    gated: set[int] = field(default_factory=set)  # choices whose only calls were gated: answered again
    sent_text: dict[int, str] = field(default_factory=dict)  # content sent per gated-capable choice

    def __post_init__(self) -> None:
        if self.request.kind == "completion" and self.request.output.echo:
            self.echoed = set()

    def deltas(self, out: Any) -> list[Delta]:
        """The deltas of one engine output (every choice that moved or finished)."""
        found = []
        if self.request.prompt_counts is None:  # known before the first token: message_start says them
            self.request.prompt_counts = (len(out.prompt_token_ids), out.num_cached_tokens or 0)
        for c in out.outputs:
            if self.echoed is not None and c.index not in self.echoed:  # the prompt first (completions' echo)
                self.echoed.add(c.index)
                found.append(echo_delta(self.request, c.index, self.prompt_ids, out.prompt_logprobs, self.tokenizer))
            delta = self._choice_delta(c)
            if delta is not None:
                found.append(delta)
        return found

    def _choice_delta(self, c: Any) -> Delta | None:
        start = self.seen.get(c.index, 0)
        num_new = len(c.token_ids) - start
        new_finish = c.finish_reason is not None and c.index not in self.sent_finish
        if num_new <= 0 and not new_finish:
            return None
        self.seen[c.index] = len(c.token_ids)
        if c.index in self.gated:  # the rest of a gated answer: never sent (the backend answers again)
            self.sent_finish.add(c.index)
            return None
        if new_finish:
            self.sent_finish.add(c.index)
            if c.index == 0 and isinstance(c.stop_reason, str):  # Anthropic's stop_sequence
                self.request.decide("stop_sequence", c.stop_reason)
        reason = "stop" if c.finish_reason == "abort" else c.finish_reason
        reasoning, text = self._split_reasoning(c, c.delta_text or "", new_finish)
        calls = None
        if self.plan is not None and self.plan.parser is not None:
            split = self.tool_streams.get(c.index) or self.tool_streams.setdefault(c.index, self._new_stream(c.index))
            if c.index in self.confidences and c.logprobs:
                self.confidences[c.index].add(c.logprobs[start:])
            text, calls = split.push(text)
            if split.gated and not split.num_calls:
                return self._gate(c.index, text, num_new)
            if new_finish:
                more_text, more_calls = split.finish()
                text, calls = text + more_text, calls + more_calls
                if split.gated and not split.num_calls:
                    return self._gate(c.index, text, num_new)
                if split.num_calls and reason == "stop":
                    reason = "tool_calls"
        if c.index in self.confidences:  # kept only while the gate may answer again from it
            self.sent_text[c.index] = self.sent_text.get(c.index, "") + text
        return Delta(
            index=c.index,
            text=text,
            num_tokens=max(num_new, 0),
            finish_reason=reason if new_finish else None,
            logprobs=openai_logprobs(
                self.request.kind, c.logprobs[start:] if c.logprobs and self.show_logprobs else None
            ),
            tool_calls=calls or None,
            extra={"reasoning_content": reasoning} if reasoning else None,
        )

    def _new_stream(self, index: int) -> Any:
        stream = self.plan.new_stream()
        if self.gate_threshold > 0 and self.plan.is_free:
            self.confidences[index] = CallConfidence(self.gate_threshold)
            stream.gate = self.confidences[index].passes
        return stream

    def _gate(self, index: int, text: str, num_new: int) -> Delta | None:
        """A choice whose call the gate refused: the content before the call still goes out, then nothing."""
        self.gated.add(index)
        self.sent_text[index] = self.sent_text.get(index, "") + text
        return Delta(index=index, text=text, num_tokens=max(num_new, 0)) if text else None

    def gate_decision(self, retried: bool) -> None:
        """Record what the gate judged (the request's ``tool_call_gate`` decision), when it judged a call."""
        judged = [j for conf in self.confidences.values() for j in conf.judged]
        if judged:
            self.request.decide(
                "tool_call_gate", {"min_confidence": self.gate_threshold, "calls": judged, "answered_again": retried}
            )

    def _split_reasoning(self, c: Any, text: str, new_finish: bool) -> tuple[str, str]:
        """(reasoning, answer text) of a choice's new text; all answer without a thinking control."""
        if self.params.thinking is None:
            return "", text
        parser = self.reasoning_parser
        assert parser is not None  # the backend gives a thinking control only to a model with a parser
        self.num_reasoning[c.index] = c.num_reasoning_tokens
        split = self.reasoning_streams.get(c.index) or self.reasoning_streams.setdefault(
            c.index, ReasoningSplitter(parser, self.params.thinking.starts_thinking)
        )
        reasoning, text = split.push(text)
        if new_finish:
            more_r, more_t = split.finish()
            reasoning, text = reasoning + more_r, text + more_t
        return reasoning, text

    def usage(self, last: Any) -> Delta:
        """The final delta: usage and timings of the engine's last output (and, for a reasoning
        model, the thinking telemetry in ``decisions["thinking"]``: budgets learned from traffic)."""
        if self.params.thinking is not None:
            self.request.decide(
                "thinking",
                {
                    "closed_by": [c.thinking_closed_by for c in last.outputs],
                    "first_pass": [c.thinking_first_pass for c in last.outputs],
                    "spent": [c.thinking_spent for c in last.outputs],
                },
            )
        scheduled, first = last.first_scheduled_time, last.first_token_time
        return Delta(
            prompt_tokens=len(last.prompt_token_ids),
            completion_tokens=sum(self.seen.values()),
            cached_tokens=last.num_cached_tokens or 0,
            reasoning_tokens=sum(self.num_reasoning.values()) if self.params.thinking is not None else None,
            queue_s=None if scheduled is None else max(0.0, scheduled - last.arrival_time),
            prefill_s=None if scheduled is None or first is None else max(0.0, first - scheduled),
        )


def engine_failure(backend: str, e: Exception) -> BackendError:
    """What a client is told when the engine failed its request: a grammar the matcher
    gave up on is the schema's doing (400); anything else is ours (500). Neither message
    carries the engine's own text (parser state, internals): that goes to the log, under
    an id the message gives."""
    error_id = secrets.token_hex(6)
    log.error("engine error %s on %s: %s: %s", error_id, backend, type(e).__name__, e)
    if "breaks the request's grammar" in str(e):
        return BackendError(
            f"The answer could not be kept inside the request's schema: the grammar matcher gave up "
            f"(error id {error_id}). Simplify response_format or the tool parameters (fewer "
            "alternatives, no required recursion).",
            kind="bad_request",
            status=400,
            backend=backend,
        )
    return BackendError(
        f"{backend}: the engine failed this request (error id {error_id}); retry, and report the id if it persists.",
        "error",
        500,
        backend,
    )


def openai_logprobs(kind: str, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Engine logprob entries -> OpenAI's shape (chat ``content`` list, or the
    completions ``tokens``/``token_logprobs``/``top_logprobs`` lists)."""
    if not entries:
        return None
    if kind == "chat":
        return {
            "content": [
                {
                    "token": e["token"],
                    "logprob": e["logprob"],
                    "bytes": list(e["token"].encode("utf-8")),
                    "top_logprobs": [
                        {"token": t["token"], "logprob": t["logprob"], "bytes": list(t["token"].encode("utf-8"))}
                        for t in e.get("top") or []
                    ],
                }
                for e in entries
            ]
        }
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e.get("top") or []} for e in entries],
        "text_offset": [],
    }
